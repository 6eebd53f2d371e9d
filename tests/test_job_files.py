"""``estimate --from`` / ``plan --from``: the plan a job's own files state (autotune.job_files), read back field by
field; a round trip through ``autotune emit``; the alternatives ``plan --from`` ranks; bad inputs exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.job_files import read_job

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "examples" / "jobs"
GPU = ["--gpu", "h100-sxm-80gb"]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def fields(plan) -> dict:
    return {k: getattr(plan, k) for k in ("engine", "tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch_size",
                                         "global_batch_size", "grad_accum_steps", "seq_len", "precision",
                                         "recompute", "recompute_num_layers", "zero_stage", "sequence_parallel")}


# ---- each file kind, read back to the plan it states --------------------------------------------------------
def test_megatron_script_with_torchrun_launch_line():
    job = read_job([str(JOBS / "megatron_args_llama3_70b.sh")], gpu="h100-sxm-80gb")
    assert job.model.name == "llama3-70b"  # the shape, rope base and tokenizer name pick the preset
    assert job.cluster.num_gpus == 64 and job.cluster.gpus_per_node == 8  # --nnodes 8 x --nproc_per_node 8
    assert fields(job.plan) == dict(engine="megatron", tp=8, pp=4, vpp=4, dp=2, cp=1, ep=1, micro_batch_size=1,
                                    global_batch_size=512, grad_accum_steps=256, seq_len=8192, precision="bf16",
                                    recompute="selective", recompute_num_layers=None, zero_stage=1,
                                    sequence_parallel=True)
    assert job.plan.overlap_comm


USER_SCRIPT = r"""#!/bin/bash
NNODES=2
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPT="--num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
     --ffn-hidden-size 14336 --group-query-attention --num-query-groups 8 --swiglu"
torchrun --nnodes=$NNODES --nproc-per-node=8 --rdzv-backend c10d \
    /opt/Megatron-LM/pretrain_gpt.py $GPT \
    --seq-length=16384 --max-position-embeddings 16384 \
    --position-embedding-type rope --rotary-base 500000 --normalization RMSNorm \
    --micro-batch-size 1 --global-batch-size '64' \
    --tensor-model-parallel-size 2 --context-parallel-size "2" --sequence-parallel \
    --recompute-granularity full --recompute-method block --recompute-num-layers 4 \
    --bf16 --fp8-format hybrid --fp8-amax-history-len 1024 \
    --tokenizer-type NullTokenizer --vocab-size 128256 --mock-data
"""


def test_users_pretrain_gpt_command_line(tmp_path):
    path = tmp_path / "train_llama.sh"
    path.write_text(USER_SCRIPT)
    job = read_job([str(path)], gpu="h100-sxm-80gb")
    assert job.model.name == "llama3-8b" and job.model.vocab_size == 128256
    assert job.cluster.num_gpus == 16
    assert fields(job.plan) == dict(engine="megatron", tp=2, pp=1, vpp=1, dp=4, cp=2, ep=1, micro_batch_size=1,
                                    global_batch_size=64, grad_accum_steps=16, seq_len=16384, precision="fp8",
                                    recompute="full", recompute_num_layers=4, zero_stage=0,
                                    sequence_parallel=True)


def test_deepspeed_json_with_model_and_world_size():
    job = read_job([str(JOBS / "ds_config_zero3.json")], model="llama3-8b", gpu="h100-sxm-80gb", num_gpus=32,
                   seq_len=4096)
    assert fields(job.plan) == dict(engine="deepspeed", tp=1, pp=1, vpp=1, dp=32, cp=1, ep=1, micro_batch_size=2,
                                    global_batch_size=256, grad_accum_steps=4, seq_len=4096, precision="bf16",
                                    recompute="full", recompute_num_layers=None, zero_stage=3,
                                    sequence_parallel=False)
    assert job.settings.reduce_bucket_size == 50_000_000


def test_torchtitan_toml():
    job = read_job([str(JOBS / "torchtitan_llama3_8b.toml")], gpu="h100-sxm-80gb")
    assert job.model.name == "llama3-8b" and job.cluster.num_gpus == 16
    assert fields(job.plan) == dict(engine="fsdp", tp=2, pp=1, vpp=1, dp=8, cp=1, ep=1, micro_batch_size=2,
                                    global_batch_size=64, grad_accum_steps=4, seq_len=8192, precision="bf16",
                                    recompute="full", recompute_num_layers=None, zero_stage=3,
                                    sequence_parallel=True)


# ---- a round trip: emit a plan, read its files back -------------------------------------------------------
BASE = ["--model", "llama3-8b", *GPU, "--num-gpus", "16", "--seq-len", "2048", "--global-batch", "64"]
ROUND_TRIPS = {
    "megatron": (["--engine", "megatron", "--tp", "2", "--pp", "2", "--zero", "1", "--recompute", "selective"],
                 ["megatron_args.sh", "launch_torchrun.sh"], []),
    "megatron-fsdp": (["--engine", "megatron", "--tp", "2", "--zero", "3", "--recompute", "full"],
                      ["megatron_args.sh", "launch_torchrun.sh"], []),
    "megatron-fsdp-optim-grads": (["--engine", "megatron", "--zero", "2", "--pp", "2"],
                                  ["megatron_args.sh", "launch_torchrun.sh"], []),
    # activation CPU offload: --cpu-offloading-num-layers reads back as activation_offload_layers
    "megatron-activation-offload": (["--engine", "megatron", "--zero", "3", "--recompute", "none",
                                     "--activation-offload-layers", "4"],
                                    ["megatron_args.sh", "launch_torchrun.sh"], []),
    "deepspeed": (["--engine", "deepspeed", "--zero", "3", "--micro-batch", "2", "--recompute", "full"],
                  ["ds_config.json"], ["--model", "llama3-8b", "--num-gpus", "16", "--recompute", "full",
                                     "--seq-len", "2048"]),  # what a DeepSpeed config does not hold
    # DeepSpeed has no FP8 key: the bundle's te_fp8_recipe.py says it (read as a torchtitan module before: refused)
    "deepspeed-fp8": (["--engine", "deepspeed", "--zero", "1", "--precision", "fp8"],
                      ["ds_config.json", "te_fp8_recipe.py"], ["--model", "llama3-8b", "--num-gpus", "16",
                                                               "--recompute", "selective", "--seq-len", "2048"]),
    "fsdp": (["--engine", "fsdp", "--tp", "2", "--zero", "3", "--recompute", "full", "--torchtitan-version", "0.2"],
             ["torchtitan_job.toml"], []),
    # CPUOffloadPolicy (enable_cpu_offload): read as the parameters' offload alone before, which no engine runs
    "fsdp-cpu-offload": (["--engine", "fsdp", "--zero", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu",
                          "--torchtitan-version", "0.2"], ["torchtitan_job.toml"], []),
    # accelerate's FSDP2 file leaves selective AC to the script (fsdp_activation_checkpointing false): --recompute
    # says it; read as no recompute before, whatever the flag
    "fsdp-accelerate-selective": (["--engine", "fsdp", "--zero", "3", "--recompute", "selective"],
                                  ["accelerate_fsdp.yaml"], ["--model", "llama3-8b", "--seq-len", "2048",
                                                             "--global-batch", "64", "--recompute", "selective"]),
    # accelerate's TP runs no sequence parallelism (the model's transformers tp_plan): its file is written only for a
    # plan without it (it was written for an sp plan too, read back as sp off); torchtitan 0.2 always runs sp, so no
    # TOML for a plan without it
    "fsdp-accelerate-tp": (["--engine", "fsdp", "--tp", "2", "--zero", "3", "--no-sequence-parallel",
                            "--torchtitan-version", "0.2"], ["accelerate_fsdp.yaml"],
                           ["--model", "llama3-8b", "--seq-len", "2048", "--global-batch", "64",
                            "--recompute", "selective"]),
    # 0.3's ParallelismConfig(enable_sequence_parallel=False): read as sp on before
    "fsdp-0.3-tp-no-sp": (["--engine", "fsdp", "--tp", "2", "--zero", "3", "--no-sequence-parallel",
                           "--torchtitan-version", "0.3"], ["torchtitan_plan.py"], []),
    # Bridge's optimizer.optimizer: sgd (read as adamw before: another optimizer-state ledger)
    "bridge-sgd-yaml": (["--engine", "megatron", "--tp", "2", "--optimizer", "sgd"], ["bridge_overrides.yaml"],
                        ["--num-gpus", "16"]),
    "bridge-sgd-args": (["--engine", "megatron", "--tp", "2", "--optimizer", "sgd"], ["bridge_overrides.args"],
                        ["--num-gpus", "16"]),
    # the micro-batch is the script's: --micro-batch gives it (ignored before, "the files: 1")
    "fsdp-accelerate-micro-batch": (["--engine", "fsdp", "--zero", "3", "--recompute", "full", "--micro-batch", "2"],
                                    ["accelerate_fsdp.yaml"], ["--model", "llama3-8b", "--seq-len", "2048",
                                                               "--global-batch", "64", "--micro-batch", "2"]),
    # FP8 linears are the script's over mixed_precision bf16: --precision fp8 gives them (not applied before)
    "fsdp-accelerate-fp8": (["--engine", "fsdp", "--zero", "3", "--recompute", "full", "--precision", "fp8"],
                            ["accelerate_fsdp.yaml"], ["--model", "llama3-8b", "--seq-len", "2048", "--global-batch",
                                                       "64", "--recompute", "full", "--precision", "fp8"]),
    "megatron-deepspeed": (["--engine", "megatron-deepspeed", "--tp", "2", "--zero", "1"],
                           ["megatron_deepspeed_args.sh", "ds_config.json"], ["--num-gpus", "16"]),
    # the fork's --checkpoint-activations (what emit writes for full recompute): read as no recompute before
    "megatron-deepspeed-recompute": (["--engine", "megatron-deepspeed", "--zero", "1", "--recompute", "full"],
                                     ["megatron_deepspeed_args.sh", "ds_config.json"], ["--num-gpus", "16"]),
}


@pytest.mark.parametrize("engine", sorted(ROUND_TRIPS))
def test_emitted_files_estimate_to_the_same_plan_and_step_time(engine, tmp_path, capsys):
    plan_flags, files, extra = ROUND_TRIPS[engine]
    estimate_flags = [f for f in plan_flags if f not in ("--torchtitan-version", "0.2", "0.3")]
    estimate_flags += ["--engine-version", "fsdp=0.3"] if "0.3" in plan_flags else []  # that release's defaults
    code, out, err = run(["estimate", *BASE, *estimate_flags, "--json"], capsys)
    assert code == 0, err
    before = json.loads(out)
    code, _, err = run(["emit", *BASE, *plan_flags, "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    code, out, err = run(["estimate", "--from", *(tmp_path / "job" / f for f in files), *GPU, *extra, "--json"],
                         capsys)
    assert code == 0, err
    after = json.loads(out)
    assert after["plan"] == before["plan"]
    assert after["time"]["step_time_s"] == pytest.approx(before["time"]["step_time_s"], rel=1e-9)
    assert after["memory"]["total"] == pytest.approx(before["memory"]["total"], rel=1e-9)


def test_plan_json_reads_back(tmp_path, capsys):
    code, _, err = run(["emit", *BASE, "--engine", "megatron", "--tp", "2", "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    code, out, err = run(["estimate", "--from", tmp_path / "job" / "plan.json", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["plan"]["tp"] == 2


@pytest.mark.parametrize("flags", [["--precision", "fp8", "--fp8-recipe", "te-mxfp8"], ["--precision", "fp4"]],
                         ids=["mxfp8", "nvfp4"])
def test_a_blackwell_recipe_bundle_validates_and_reads_back(flags, tmp_path, capsys):
    """plan.json carries the GPU's compute capability, which the MXFP8 / NVFP4 rules read: without it the bundle
    emit wrote for a B200 was refused by `validate` and `estimate --from` ("b200 states none")."""
    gpu = ["--gpu", "b200", "--num-gpus", "8", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "8"]
    code, _, err = run(["emit", *gpu, "--engine", "megatron", "--zero", "1", *flags, "--out", tmp_path / "job"],
                       capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "job" / "plan.json").read_text())["cluster"]["spec"]["gpu"]["compute_capability"] \
        == "10.0"
    code, out, err = run(["validate", tmp_path / "job" / "megatron_args.sh", tmp_path / "job" / "plan.json"], capsys)
    assert code == 0 and "no problems" in out, err
    code, out, err = run(["estimate", "--from", tmp_path / "job" / "plan.json", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["plan"]["precision"] == flags[1]


# ---- plan --from: the current job ranked, the diff, the gain ----------------------------------------------
def test_plan_from_shows_the_current_job_and_a_better_or_tied_plan(capsys):
    argv = ["plan", "--from", JOBS / "megatron_args_llama3_70b.sh", *GPU, "--top-k", "5"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert "current job: megatron tp8 pp4x4 dp2" in out and "its rank among the" in out
    assert "#1 vs the current job:" in out and "predicted gain:" in out and "±" in out
    assert "legend:" in out and "rules:" in out
    code, out, err = run([*argv, "--json"], capsys)
    doc = json.loads(out)
    assert all(c["plan"]["engine"] == "megatron" for c in doc["search"]["candidates"])  # the job's engine
    assert all(c["plan"]["global_batch_size"] == 512 and c["plan"]["seq_len"] == 8192
               for c in doc["search"]["candidates"])
    assert doc["current_rank"] is not None and doc["diff"]
    assert doc["gain"] >= 0 or doc["tied"]
    assert doc["gain_uncertainty"] > 0


def test_plan_from_the_best_plan_is_kept(tmp_path, capsys):
    code, out, _ = run(["plan", *BASE, "--engine", "megatron", "--json", "--top-k", "1"], capsys)
    best = json.loads(out)["candidates"][0]["plan"]
    flags = ["--tp", best["tp"], "--pp", best["pp"], "--vpp", best["vpp"], "--cp", best["cp"], "--zero",
             best["zero_stage"], "--micro-batch", best["micro_batch_size"], "--recompute", best["recompute"]]
    code, _, err = run(["emit", *BASE, "--engine", "megatron", *flags, "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    code, out, err = run(["plan", "--from", tmp_path / "job" / "megatron_args.sh", *GPU, "--num-gpus", "16"],
                         capsys)
    assert code == 0, err
    assert "its rank among the" in out and ": #1\n" in out and "keep it" in out


# ---- bad inputs: exit 2, the missing field and the flag that supplies it -----------------------------------
@pytest.mark.parametrize("argv, needles", [
    (["estimate", "--from", JOBS / "ds_config_zero3.json", *GPU], ["the model", "--model"]),
    (["plan", "--from", JOBS / "megatron_args_llama3_70b.sh"], ["the GPU", "--gpu"]),
    (["estimate", "--from", JOBS / "ds_config_zero3.json", "--model", "llama3-8b", "--num-gpus", "16", *GPU],
     ["--num-gpus 16 but the files state 32", "`plan --from`"]),  # 256 / (2 x 4) = dp 32, as DeepSpeed asserts
    (["estimate", "--from", JOBS / "megatron_args_llama3_70b.sh", "--num-gpus", "32", *GPU],
     ["--num-gpus 32 but the files state 64"]),
    (["estimate", "--from", JOBS / "nothing_here.json", *GPU], ["no such file"]),
])
def test_bad_inputs_exit_2_naming_the_field(argv, needles, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    for needle in needles:
        assert needle in err, (needle, err)


def test_a_deepspeed_config_states_its_world_size_by_its_batch_triple_alone(tmp_path, capsys):
    """DeepSpeed accepts a config with train_batch_size, the micro-batch and the accumulation all given on one world
    size only (runtime/config.py _batch_assertion), so the config states it: estimate --from needs no --num-gpus,
    and plan --from --num-gpus N plans the job on N (it refused: 'train_batch_size is not ... x dp')."""
    model = ["--model", "llama3-8b", "--seq-len", "4096"]
    code, out, err = run(["estimate", "--from", JOBS / "ds_config_zero3.json", *model, *GPU, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["plan"]["dp"] == 32 and "32 GPUs, the only one its batch triple admits" in err
    code, out, err = run(["plan", "--from", JOBS / "ds_config_zero3.json", *model, *GPU, "--num-gpus", "64"], capsys)
    assert code == 0, err
    assert "planned on 64 GPUs (--num-gpus) instead of its 32" in out
    # with the triple incomplete ("auto", or a value left out) the size is the user's to give
    ds = json.loads((JOBS / "ds_config_zero3.json").read_text())
    ds["train_batch_size"] = "auto"
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    code, _, err = run(["estimate", "--from", tmp_path / "ds.json", *model, *GPU], capsys)
    assert code == 2 and "the world size" in err and "--num-gpus" in err


def test_megatron_args_without_a_launch_line_need_the_world_size(tmp_path, capsys):
    path = tmp_path / "megatron_args.sh"
    path.write_text("ARGS=(\n  --num-layers 30 --hidden-size 4096 --num-attention-heads 32\n"
                    "  --tensor-model-parallel-size 2 --seq-length 4096\n)\n")
    code, _, err = run(["estimate", "--from", path, *GPU], capsys)
    assert code == 2 and "the world size" in err and "--num-gpus N" in err
    code, _, err = run(["estimate", "--from", path, *GPU, "--num-gpus", "8"], capsys)
    assert code == 2 and "vocabulary size" in err and "--model" in err  # no preset has this shape
    code, out, err = run(["estimate", "--from", path, *GPU, "--num-gpus", "8", "--model", "llama2-7b"], capsys)
    assert code == 0 and "tp2 pp1 dp4" in out, err


def test_unknown_kinds_say_which_are_supported(tmp_path, capsys):
    cfg = tmp_path / "job.cfg"
    cfg.write_text("x = 1\n")
    code, _, err = run(["plan", "--from", cfg, *GPU, "--num-gpus", "8"], capsys)
    assert code == 2 and "--from reads deepspeed, megatron" in err and "torchtitan" in err, err
    # Bridge overrides that name no base recipe autotune knows: the model is asked for by flag
    bridge = tmp_path / "bridge_overrides.yaml"
    bridge.write_text("model:\n  tensor_model_parallel_size: 2\n")
    code, _, err = run(["plan", "--from", bridge, *GPU, "--num-gpus", "8"], capsys)
    assert code == 2 and "give --model" in err, err


def test_emit_from_writes_the_jobs_own_plan(tmp_path, capsys):
    code, _, err = run(["emit", "--from", JOBS / "ds_config_zero3.json", "--model", "llama3-8b", *GPU, "--num-gpus",
                        "32", "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    plan = json.loads((tmp_path / "job" / "plan.json").read_text())["plan"]
    assert (plan["zero_stage"], plan["micro_batch_size"], plan["global_batch_size"], plan["dp"]) == (3, 2, 256, 32)
    code, _, err = run(["emit", "--from", JOBS / "ds_config_zero3.json", "--recipe", "cpu-demo", "--out",
                        tmp_path / "other"], capsys)
    assert code == 2 and "exactly one of" in err


def test_launch_scripts_and_accelerate_configs(tmp_path, capsys):
    code, _, err = run(["emit", *BASE, "--engine", "deepspeed", "--tp", "2", "--zero", "2", "--out", tmp_path / "ds"],
                       capsys)
    assert code == 0, err
    # accelerate's TP has no sequence parallelism: its file is written for such plans only
    code, _, err = run(["emit", *BASE, "--engine", "fsdp", "--tp", "2", "--zero", "3", "--no-sequence-parallel",
                        "--out", tmp_path / "fsdp"], capsys)
    assert code == 0, err
    ds = str(tmp_path / "ds" / "ds_config.json")
    for launcher in ("launch_deepspeed.sh", "launch_torchrun.sh"):  # --num_nodes 2 --num_gpus 8 / --nnodes --nproc
        job = read_job([str(tmp_path / "ds" / launcher), ds], model="llama3-8b", gpu="h100-sxm-80gb", tp=2)
        assert job.cluster.num_gpus == 16 and (job.plan.tp, job.plan.dp, job.plan.zero_stage) == (2, 8, 2)
    with pytest.raises(ValueError, match="the world size.*--num-gpus N"):  # $SLURM_NNODES: known at run time only
        read_job([str(tmp_path / "ds" / "launch_slurm.sbatch"), ds], model="llama3-8b", gpu="h100-sxm-80gb", tp=2)
    job = read_job([str(tmp_path / "fsdp" / "accelerate_fsdp.yaml")], model="llama3-8b", gpu="h100-sxm-80gb",
                   global_batch=64, seq_len=2048)
    assert job.cluster.num_gpus == 16  # num_processes
    assert fields(job.plan) | {"sequence_parallel": None} == dict(
        engine="fsdp", tp=2, pp=1, vpp=1, dp=8, cp=1, ep=1, micro_batch_size=1, global_batch_size=64,
        grad_accum_steps=8, seq_len=2048, precision="bf16", recompute="none", recompute_num_layers=None,
        zero_stage=3, sequence_parallel=None)


def test_emit_best_writes_the_first_alternative_plan_from_ranks(tmp_path, capsys):
    code, _, err = run(["emit", *BASE, "--engine", "megatron", "--tp", "2", "--zero", "1", "--out", tmp_path / "job"],
                       capsys)
    assert code == 0, err
    files = [tmp_path / "job" / "megatron_args.sh", tmp_path / "job" / "launch_torchrun.sh"]
    code, out, err = run(["plan", "--from", *files, *GPU, "--top-k", "1", "--json"], capsys)
    assert code == 0, err
    first = json.loads(out)["search"]["candidates"][0]["plan"]
    code, _, err = run(["emit", "--from", *files, *GPU, "--best", "--out", tmp_path / "best"], capsys)
    assert code == 0, err
    assert "--best writes megatron" in err and "over the job's" in err
    assert json.loads((tmp_path / "best" / "plan.json").read_text())["plan"] == first
    code, _, err = run(["emit", *BASE, "--best", "--out", tmp_path / "x"], capsys)  # no job to improve on
    assert code == 2 and "give the job's files with --from" in err


def test_from_with_expandable_segments_leaves_the_reserve_out(capsys):
    """The allocator setting a job's files need not state: `--from ... --expandable-segments` estimates the job with
    the fragmentation reserve out of the device total, and `plan --from` searches its alternatives so."""
    argv = ["estimate", "--from", JOBS / "megatron_args_llama3_70b.sh", *GPU, "--json"]
    totals = []
    for extra in ([], ["--expandable-segments"]):
        code, out, err = run([*argv, *extra], capsys)
        assert code == 0, err
        memory = json.loads(out)["memory"]
        totals.append((memory["total"], memory["reserved"] - memory["allocated"]))  # the allocator's reserve
    assert totals[0][0] - totals[1][0] == pytest.approx(totals[0][1]) and totals[0][1] > 0
    plans = []
    for extra in ([], ["--expandable-segments"]):
        code, out, err = run(["plan", "--from", JOBS / "megatron_args_llama3_70b.sh", *GPU, "--json", *extra], capsys)
        assert code == 0, err
        plans.append(json.loads(out)["search"]["num_feasible"])
    assert plans[1] >= plans[0]


def test_megatron_deepspeed_moe_fp8_files_read_back(tmp_path, capsys):
    """The fork's own names: --moe-expert-parallel-size (DeepSpeed-MoE's EP) and --fp8-hybrid; read as ep 1 and
    bf16 before. Without --enable-expert-tensor-parallelism the reading says the experts are whole per TP rank."""
    flags = ["--model", "mixtral-8x7b", *GPU, "--num-gpus", "16", "--seq-len", "2048", "--global-batch", "64",
             "--engine", "megatron-deepspeed", "--tp", "2", "--pp", "2", "--ep", "4", "--zero", "1", "--precision",
             "fp8"]
    code, out, err = run(["estimate", *flags, "--json"], capsys)
    assert code == 0, err
    before = json.loads(out)
    code, _, err = run(["emit", *flags, "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    files = [tmp_path / "job" / f for f in ("megatron_deepspeed_args.sh", "ds_config.json")]
    code, out, err = run(["estimate", "--from", *files, *GPU, "--num-gpus", "16", "--model", "mixtral-8x7b",
                          "--json"], capsys)
    assert code == 0, err
    after = json.loads(out)
    assert after["plan"] == before["plan"] and after["plan"]["ep"] == 4 and after["plan"]["precision"] == "fp8"
    assert after["time"]["step_time_s"] == pytest.approx(before["time"]["step_time_s"], rel=1e-9)
    assert "--enable-expert-tensor-parallelism" not in err
    args = files[0].read_text().replace(" --enable-expert-tensor-parallelism", "").replace(
        "--enable-expert-tensor-parallelism", "")
    files[0].write_text(args)
    code, _, err = run(["estimate", "--from", *files, *GPU, "--num-gpus", "16", "--model", "mixtral-8x7b"], capsys)
    assert code == 0 and "without --enable-expert-tensor-parallelism each of the 2 TP ranks" in err


def test_an_accelerate_config_that_offloads_reads_back_as_fsdp2_offloads(tmp_path, capsys):
    # fsdp_offload_params is FSDP2's CPUOffloadPolicy: parameters, gradients and the optimizer step on the host; read
    # as the parameters alone, the plan was refused by the FSDP engine's own rule
    code, _, err = run(["emit", *BASE, "--engine", "fsdp", "--zero", "3", "--offload-optimizer", "cpu",
                        "--offload-param", "cpu", "--out", tmp_path / "fsdp"], capsys)
    assert code == 0, err
    assert "fsdp_offload_params: true" in (tmp_path / "fsdp" / "accelerate_fsdp.yaml").read_text()
    job = read_job([str(tmp_path / "fsdp" / "accelerate_fsdp.yaml")], model="llama3-8b", gpu="h100-sxm-80gb",
                   global_batch=64, seq_len=2048)
    assert (job.plan.zero_stage, job.plan.offload_param, job.plan.offload_optimizer) == (3, "cpu", "cpu")

