"""Issue 21, "nonsense accepted": each input below was once accepted (and produced a report or files that cannot
work). Each is now refused with the rule and the way out: exit 2 from the CLI, InputError from the library, never a
traceback. The CLI runs in-process (``autotune.cli.main`` returns the exit code); nothing here starts a process."""

from pathlib import Path

import pytest
import yaml

from autotune import resources
from autotune.api import make_plan
from autotune.cli import main
from autotune.emit.launch import render_launch_scripts
from autotune.emit.options import EmitOptions, LaunchOptions
from autotune.errors import InputError
from autotune.recipebook import load_recipe, recipe_estimate
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan

H100 = ["--gpu", "h100-sxm-80gb"]


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


# ---- 1. sequence longer than a learned position table --------------------------------------------------------
def test_seq_len_beyond_the_learned_position_table_is_refused(capsys):
    # tiny-gpt has a learned table of 512 positions; 4,096 tokens used to be estimated at 108.9% HFU.
    code, out, err = run(["estimate", "--model", "tiny-gpt", *H100, "--num-gpus", "8", "--seq-len", "4096"], capsys)
    assert code == 2 and out == ""
    assert "seq_len (4096)" in err and "max_position_embeddings 512" in err and "seq_len <= 512" in err
    with pytest.raises(InputError, match="max_position_embeddings 512"):
        make_plan(load_model("tiny-gpt"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8), seq_len=4096)


@pytest.mark.parametrize("command", [["plan", "--num-gpus", "8"], ["tune", "--num-gpus", "8"]])
def test_plan_and_tune_say_no_layout_helps_a_sequence_past_the_table(command, tmp_path, capsys):
    # Checked once before searching: the planner used to say "does not fit on any number of GPUs".
    out_dir = ["--out", str(tmp_path / "t")] if command[0] == "tune" else []
    code, out, err = run([command[0], "--model", "tiny-gpt", *H100, *command[1:], "--seq-len", "4096", *out_dir],
                         capsys)
    assert code == 2 and "max_position_embeddings 512" in err and "does not fit" not in err


def test_seq_len_within_the_table_and_rope_models_are_accepted(capsys):
    assert run(["estimate", "--model", "tiny-gpt", *H100, "--num-gpus", "8", "--seq-len", "512"], capsys)[0] == 0
    # RoPE computes positions: a longer context than the config's max_position_embeddings (8,192) is the user's call.
    code, _, _ = run(["estimate", "--model", "llama3-8b", *H100, "--num-gpus", "8", "--seq-len", "16384",
                      "--zero", "3", "--recompute", "full"], capsys)
    assert code == 0


def test_a_gpt2_like_yaml_model_is_held_to_its_own_table(tmp_path, capsys):
    spec = {"name": "gpt2-like", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
            "ffn_hidden_size": 512, "vocab_size": 1000, "position_embedding": "learned",
            "max_position_embeddings": 1024}
    path = tmp_path / "gpt2-like.yaml"
    path.write_text(yaml.safe_dump(spec))
    base = ["estimate", "--model", str(path), *H100, "--num-gpus", "1"]
    code, _, err = run([*base, "--seq-len", "1025"], capsys)
    assert code == 2 and "max_position_embeddings 1024" in err
    assert run([*base, "--seq-len", "1024"], capsys)[0] == 0


# ---- 2. fp8 on the cpu -------------------------------------------------------------------------------------
def test_fp8_on_the_cpu_is_refused_bf16_and_fp16_are_not(capsys):
    base = ["estimate", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64"]
    code, out, err = run([*base, "--precision", "fp8"], capsys)
    assert code == 2 and out == ""
    assert "cpu has no fp8" in err and "bf16, fp16" in err and "--precision" in err
    for precision in ("bf16", "fp16"):
        assert run([*base, "--precision", precision], capsys)[0] == 0


# ---- 3. environment variables the launch scripts export ------------------------------------------------------
@pytest.mark.parametrize("item", ["PATH=/evil", "LD_PRELOAD=/tmp/x.so", "PYTHONPATH=/tmp", "HOME=/tmp", "FOO=1"])
def test_nccl_env_refuses_variables_that_are_not_settings(item, tmp_path, capsys):
    out_dir = tmp_path / "job"
    code, _, err = run(["emit", "--recipe", "cpu-demo", "--out", str(out_dir), "--nccl-env", item], capsys)
    name = item.partition("=")[0]
    assert code == 2 and f"environment variable {name}" in err
    assert "NCCL_*" in err and "TORCH_*" in err and "CUDA_*" in err and f"drop {name}" in err
    assert not out_dir.exists()


def test_nccl_env_keeps_the_settings_autotune_and_users_write(tmp_path, capsys):
    out_dir = tmp_path / "job"
    code, _, err = run(["emit", "--recipe", "cpu-demo", "--out", str(out_dir), "--nccl-env", "NCCL_DEBUG=INFO",
                        "--nccl-env", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "--nccl-env", "GLOO_SOCKET_IFNAME=lo",
                        "--nccl-env", "OMP_NUM_THREADS=1"], capsys)
    assert code == 0, err
    env = (out_dir / ".deepspeed_env").read_text()
    assert "NCCL_DEBUG=INFO" in env and "GLOO_SOCKET_IFNAME=lo" in env


def test_the_library_refuses_the_same_names():
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = ParallelPlan(tp=8, dp=1, global_batch_size=1, engine="megatron")
    with pytest.raises(InputError, match="LD_PRELOAD"):
        render_launch_scripts(cluster, plan, program_args=[], env={"LD_PRELOAD": "/tmp/x.so"}, entry="train.py")
    files = render_launch_scripts(cluster, plan, program_args=[], entry="train.py",
                                  env={"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_IB_SL": "1",
                                       "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"})
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in files["launch_torchrun.sh"]


# ---- 4. the same host twice -----------------------------------------------------------------------------------
def test_a_repeated_host_is_refused(tmp_path, capsys):
    out_dir = tmp_path / "job"
    code, _, err = run(["emit", "--model", "tiny-gpt", *H100, "--num-gpus", "16", "--seq-len", "512",
                        "--out", str(out_dir), "--hosts", "n1,n1"], capsys)
    assert code == 2 and "host 'n1' given more than once" in err and "2 different hosts" in err
    assert not out_dir.exists()
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = ParallelPlan(tp=8, dp=2, global_batch_size=2, engine="megatron")
    with pytest.raises(InputError, match="given more than once"):  # host names ignore case
        render_launch_scripts(cluster, plan, EmitOptions(launch=LaunchOptions(hosts=("node1", "NODE1"))),
                              program_args=[], env={}, entry="train.py")


def test_deepspeed_itself_rejects_such_a_hostfile():
    # What the check spares the user: DeepSpeed's runner refuses a hostfile that names a host twice.
    from deepspeed.launcher.runner import _parse_hostfile

    with pytest.raises(ValueError):
        _parse_hostfile(["n1 slots=8", "n1 slots=8"])


# ---- 5. emit of a plan that does not fit ----------------------------------------------------------------------
UNFIT = ["emit", "--model", "llama3-70b", *H100, "--num-gpus", "8", "--tp", "8", "--zero", "1", "--seq-len", "8192",
         "--global-batch", "64", "--recompute", "selective"]


def test_emit_refuses_a_plan_that_does_not_fit(tmp_path, capsys):
    out_dir = tmp_path / "job"
    code, out, err = run([*UNFIT, "--out", str(out_dir)], capsys)
    assert code == 2 and out == ""
    assert "the plan does not fit: the memory ledger needs" in err and "h100-sxm-80gb has 79.65 GiB" in err
    for way_out in ("`autotune plan`", "--zero", "--offload-optimizer cpu", "--recompute full", "--allow-unfit"):
        assert way_out in err
    assert not out_dir.exists()


def test_emit_allow_unfit_writes_the_files(tmp_path, capsys):
    out_dir = tmp_path / "job"
    code, _, err = run([*UNFIT, "--out", str(out_dir), "--allow-unfit"], capsys)
    assert code == 0, err
    assert "fits: NO" in (out_dir / "plan.md").read_text() or "does not fit" in (out_dir / "plan.md").read_text()


# ---- 6. a recipe whose plan disagrees with it -----------------------------------------------------------------
def _recipe(tmp_path, **changes):
    doc = yaml.safe_load((Path(str(resources.recipes_dir())) / "cpu-demo.yaml").read_text())
    plan = dict(doc["plan"], **changes.pop("plan", {}))
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(doc | changes | {"plan": plan}))
    return path


def test_a_recipe_whose_seq_len_differs_from_its_plan_is_refused(tmp_path, capsys):
    path = _recipe(tmp_path, seq_len=256)
    code, _, err = run(["emit", "--recipe", str(path), "--out", str(tmp_path / "job")], capsys)
    assert code == 2
    assert "seq_len is 256 but plan.seq_len is 128" in err and f"autotune recipes regenerate {path}" in err
    assert "bug" not in err
    with pytest.raises(InputError, match="seq_len is 256 but plan.seq_len is 128"):
        recipe_estimate(load_recipe(str(path)))


def test_a_recipe_with_an_inconsistent_plan_is_the_recipes_problem(tmp_path, capsys):
    # The batch triple broken: once reported as "invalid emitted files (a bug: please report it)".
    path = _recipe(tmp_path, global_batch=17, plan={"global_batch_size": 17})
    code, _, err = run(["emit", "--recipe", str(path), "--out", str(tmp_path / "job")], capsys)
    assert code == 2 and "bug" not in err
    assert f"invalid recipe {path}" in err and "plan: global batch 17 != micro-batch 8" in err
    assert "fix the recipe's plan block" in err
    # A plan for another cluster size: once written as if it were right.
    path = _recipe(tmp_path, plan={"dp": 4, "global_batch_size": 32})
    code, _, err = run(["emit", "--recipe", str(path), "--out", str(tmp_path / "job2")], capsys)
    assert code == 2 and "global_batch is 16 but plan.global_batch_size is 32" in err
    assert "but the cluster has 2 GPUs" in err


# ---- 7. tune's warm-up ----------------------------------------------------------------------------------------
def test_tune_refuses_an_absurd_warm_up(tmp_path, capsys):
    out_dir = tmp_path / "study"
    code, _, err = run(["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64",
                        "--steps", "1", "--warmup-steps", "1000000", "--out", str(out_dir)], capsys)
    assert code == 2
    assert "--warmup-steps 1,000,000 with --steps 1" in err and "100 x --steps" in err and "10,000" in err
    assert not (out_dir / "trials").exists()  # refused before any trial


# ---- 8. accelerate num_processes 0 ----------------------------------------------------------------------------
def test_validate_names_num_processes_0(tmp_path, capsys):
    path = tmp_path / "accelerate.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
                    "num_processes: 0\nmixed_precision: bf16\n")
    code, _, err = run(["validate", str(path)], capsys)
    assert code == 2
    assert "num_processes (line 4) must be an integer >= 1" in err and "got 0" in err
    assert "the files do not say it" not in err


FSDP_PLAN = ["--engine", "fsdp", "--tp", "2", "--pp", "2", "--zero", "2"]
RUN_CODE_CASES = [("--linear-inputs", "shard", FSDP_PLAN), ("--grad-accumulation", "sharded", FSDP_PLAN),
                  ("--pipeline-buffers", "released", FSDP_PLAN), ("--cross-entropy", "te", FSDP_PLAN),
                  ("--tp-backward-comm", "blocking", FSDP_PLAN), ("--pp-sends", "blocking", [*FSDP_PLAN, "--vpp", "2"]),
                  ("--zero3-collectives", "lists", ["--engine", "deepspeed", "--zero", "3"]),
                  ("--cp-kv", "repeated", ["--engine", "fsdp", "--cp", "2", "--zero", "2"]),
                  ("--attention-kernel", "fa-triton", FSDP_PLAN)]


@pytest.mark.parametrize("flag, value, plan", RUN_CODE_CASES, ids=[c[0] for c in RUN_CODE_CASES])
def test_emit_refuses_the_flags_that_describe_another_programs_code(flag, value, plan, tmp_path, capsys):
    out = tmp_path / "job"
    argv = ["emit", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", *plan, "--global-batch", "8",
            flag, value, "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"drop {flag}" in err and f"autotune estimate {flag}" in err
    assert not out.exists()  # nothing written
    assert main(["estimate", *argv[1:-2]]) == 0  # estimate costs the same plan with it


@pytest.mark.parametrize("flag, value, plan, says", [
    ("--pp-sends", "blocking", FSDP_PLAN, "an interleaved pipeline"),
    ("--tp-backward-comm", "blocking", ["--engine", "fsdp", "--zero", "3"], "tensor parallelism"),
    ("--zero3-collectives", "lists", FSDP_PLAN, "DeepSpeed's ZeRO-3"),
    ("--cp-kv", "repeated", FSDP_PLAN, "context parallelism"),
    ("--attention-kernel", "fa2", [*FSDP_PLAN, "--no-flash-attention"], "a fused attention kernel"),
], ids=["pp-sends", "tp-backward-comm", "zero3-collectives", "cp-kv", "attention-kernel"])
def test_estimate_refuses_a_run_code_flag_the_plan_would_ignore(flag, value, plan, says, capsys):
    # A flag that cannot change this plan's cost is named, not silently dropped.
    argv = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", *plan,
            "--global-batch", "8", flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} {value} changes only a plan with {says}" in err and f"drop {flag}" in err
    assert "Traceback" not in err


def test_estimate_refuses_an_attention_kernel_the_gpu_lacks(capsys):
    argv = ["estimate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--num-gpus", "8", "--engine", "fsdp",
            "--zero", "3", "--global-batch", "8", "--attention-kernel", "fa3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "a100-80gb has no fa3" in err and "pick fa2 or fa-triton" in err
    assert main([*argv[:-1], "fa2"]) == 0
