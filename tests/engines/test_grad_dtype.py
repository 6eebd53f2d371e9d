"""bf16 gradients (``ParallelPlan.grad_dtype``): Megatron ``--grad-reduce-in-bf16``, as NVIDIA's Megatron-Bridge
benchmark recipes run.

- the ledger: Megatron's main_grad buffer halves (fp32 -> bf16), nothing else of the model states moves; the
  optimizer step's fp32 copy of the shard's gradients appears (as with fp16);
- the step: the data-parallel reduction moves half the bytes;
- engines that do not model it refuse it with the rule's reason, and fp16 training refuses it; the CLI exits 2;
- `plan --grad-dtype bf16` ranks Megatron plans only, each with bf16 gradients, and says so in the notation;
- the files: megatron_args.sh carries ``--grad-reduce-in-bf16``, ``--from`` reads it back to the same plan and the
  same estimate; Bridge overrides set ``grad_reduce_in_fp32: false`` where the recipe's precision is a config, and
  refuse (naming why) where it is a registered name;
- the NVIDIA-recipe bench estimates every row with bf16 gradients (its source: Bridge's benchmark defaults).
"""

from __future__ import annotations

import json

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.emit.checkpoint import CheckpointSettings
from autotune.emit.megatron_bridge import bridge_files
from autotune.emit.options import EmitOptions
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.notation import plan_notation
from autotune.specs.plan import ENGINE_NAMES, ParallelPlan
from autotune.specs.presets import load_model_preset

CKPT = CheckpointSettings(save_dir="/ckpt/run1", interval_steps=250, async_save=True)


def _pair(model="llama3-70b", n=64, **kw):
    m = load_model_preset(model)
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=n)
    base = dict(engine="megatron", tp=8, pp=2, zero_stage=1, global_batch_size=64, seq_len=4096,
                recompute="selective") | kw
    default = make_plan(m, cluster, **base)
    return m, cluster, default, default.with_(grad_dtype="bf16")


def test_the_main_grad_buffer_halves_and_nothing_else_of_the_states_moves():
    m, cluster, fp32, bf16 = _pair()
    a, b = estimate(m, cluster, fp32).memory, estimate(m, cluster, bf16).memory
    assert b.gradients == pytest.approx(a.gradients / 2)
    assert (b.weights, b.optimizer_states, b.activations, b.buffers) == (a.weights, a.optimizer_states,
                                                                         a.activations, a.buffers)
    # distributed_optimizer.py _copy_model_grads_to_main_grads: the shard's grads become fp32 copies at the step
    # (an alias of fp32 main grads before): 4 bytes per owned parameter appear, over the freed activations.
    assert a.optimizer_step == 0 and b.optimizer_step >= 0
    assert b.total < a.total - 0.4 * a.gradients / 2


def test_the_data_parallel_reduction_moves_half_the_bytes():
    m, cluster, fp32, bf16 = _pair(tp=1, pp=1, n=16, model="llama3-8b", global_batch_size=16)
    a, b = estimate(m, cluster, fp32).time, estimate(m, cluster, bf16).time
    from autotune.engines import engine_for

    assert engine_for(bf16).grad_reduce_bytes(bf16) == 2 and engine_for(fp32).grad_reduce_bytes(fp32) == 4
    assert b.step_time_s < a.step_time_s and b.optimizer_s < a.optimizer_s


@pytest.mark.parametrize("engine", [e for e in ENGINE_NAMES if e != "megatron"])
def test_engines_that_do_not_model_it_refuse_it(engine):
    m = load_model_preset("llama3-8b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = ParallelPlan(engine=engine, dp=8, zero_stage=1 if engine != "fsdp" else 3, global_batch_size=8,
                        seq_len=2048, grad_dtype="bf16")
    rules = dict(plan_problems(m, cluster, plan))
    assert f"{engine}:grad_dtype" in rules, rules
    assert "not modelled" in rules[f"{engine}:grad_dtype"] and "--grad-dtype" in rules[f"{engine}:grad_dtype"]
    assert "megatron:grad_dtype" not in dict(plan_problems(m, cluster, plan.with_(engine="megatron")))


def test_fp16_training_refuses_bf16_gradients():
    m, cluster, _, bf16 = _pair()
    rules = dict(plan_problems(m, cluster, bf16.with_(precision="fp16")))
    assert "fp16" in rules["megatron:grad_dtype"]


def test_an_unknown_gradient_dtype_is_refused():
    with pytest.raises(InputError, match="grad_dtype must be bf16"):
        ParallelPlan(grad_dtype="fp8")


def _run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


EST = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--seq-len", "2048",
       "--global-batch", "64", "--zero", "1", "--recompute", "selective"]


def test_cli_refuses_it_for_deepspeed_and_shows_it_for_megatron(capsys):
    code, _, err = _run([*EST, "--engine", "deepspeed", "--grad-dtype", "bf16"], capsys)
    assert code == 2 and "bf16 gradients are not modelled" in err and "Traceback" not in err
    code, out, err = _run([*EST, "--engine", "megatron", "--tp", "2", "--grad-dtype", "bf16", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["plan"]["grad_dtype"] == "bf16"
    code, out, err = _run([*EST, "--engine", "megatron", "--tp", "2", "--json"], capsys)
    assert code == 0 and "grad_dtype" not in json.loads(out)["plan"]  # the engine's default: not in the record


def test_plan_ranks_megatron_plans_with_bf16_gradients_only(capsys):
    code, out, err = _run(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8",
                           "--seq-len", "2048", "--global-batch", "32", "--grad-dtype", "bf16", "--json"], capsys)
    assert code == 0, err
    ranked = json.loads(out)["candidates"]
    assert ranked and all(c["plan"]["engine"] == "megatron" and c["plan"]["grad_dtype"] == "bf16" for c in ranked)
    code, out, err = _run(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8",
                           "--seq-len", "2048", "--global-batch", "32", "--grad-dtype", "bf16", "--top-k", "3"],
                          capsys)
    assert code == 0 and "grads-bf16" in out


def test_notation_names_it():
    _, _, fp32, bf16 = _pair()
    assert plan_notation(bf16).endswith("bf16 grads-bf16") and "grads" not in plan_notation(fp32)


def test_megatron_args_carry_it_and_from_reads_it_back(tmp_path, capsys):
    flags = ["--engine", "megatron", "--tp", "2", "--grad-dtype", "bf16"]
    code, before, err = _run([*EST, *flags, "--json"], capsys)
    assert code == 0, err
    code, _, err = _run(["emit", *EST[1:], *flags, "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    args = (tmp_path / "job" / "megatron_args.sh").read_text()
    assert "--grad-reduce-in-bf16" in args
    code, after, err = _run(["estimate", "--from", tmp_path / "job" / "megatron_args.sh",
                             tmp_path / "job" / "launch_torchrun.sh", "--gpu", "h100-sxm-80gb", "--json"], capsys)
    assert code == 0, err
    before, after = json.loads(before), json.loads(after)
    assert after["plan"] == before["plan"] and after["plan"]["grad_dtype"] == "bf16"
    assert after["memory"]["total"] == pytest.approx(before["memory"]["total"], rel=1e-9)
    assert after["time"]["step_time_s"] == pytest.approx(before["time"]["step_time_s"], rel=1e-9)
    # the default plan's file has no such flag
    m, cluster, fp32, _ = _pair(model="llama3-8b", n=16, tp=2, pp=1, global_batch_size=64, seq_len=2048)
    assert "--grad-reduce-in-bf16" not in render_bundle(estimate(m, cluster, fp32)).files["megatron_args.sh"]


def test_bridge_overrides_set_it_or_refuse_naming_why():
    m, cluster, fp32, bf16 = _pair()  # llama3-70b: the recipe's precision is a MixedPrecisionConfig
    files = bridge_files(m, cluster, bf16, EmitOptions(), CKPT, fp8_param_gather=True)
    args = next(v for k, v in files.items() if k.endswith(".args"))
    assert "ddp.grad_reduce_in_fp32=false" in args.lower() and "mixed_precision.grad_reduce_in_fp32=false" in \
        args.lower()
    default = next(v for k, v in bridge_files(m, cluster, fp32, EmitOptions(), CKPT, fp8_param_gather=True).items()
                   if k.endswith(".args"))
    assert "ddp.grad_reduce_in_fp32=true" in default.lower()
    m8, c8, _, bf16_8b = _pair(model="llama3-8b", n=8, tp=1, pp=1, global_batch_size=8)  # a registered name
    with pytest.raises(InputError, match="registered precision name"):
        bridge_files(m8, c8, bf16_8b, EmitOptions(), CKPT, fp8_param_gather=True)
    # the bundle then holds megatron_args.sh alone and says why there are no Bridge files
    bundle = render_bundle(estimate(m8, c8, bf16_8b))
    assert "megatron_args.sh" in bundle.files and not any(k.startswith("bridge_") for k in bundle.files)
    assert "registered precision name" in bundle.files["plan.md"]


def test_the_nvidia_bench_estimates_with_bf16_gradients():
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import accuracy_nvidia_recipes as nv
    finally:
        sys.path.remove(str(bench))
    row = nv.load_rows()[0]
    argv, _ = nv.estimate_argv(row, "llama3-70b", "gb200", "fp8")
    assert argv[argv.index("--grad-dtype") + 1] == "bf16" == nv.GRAD_DTYPE


def test_from_with_grad_dtype_estimates_the_job_with_it_or_refuses(tmp_path, capsys):
    code, _, err = _run(["emit", *EST[1:], "--engine", "megatron", "--tp", "2", "--out", tmp_path / "mg"], capsys)
    assert code == 0, err
    mg = [tmp_path / "mg" / "megatron_args.sh", tmp_path / "mg" / "launch_torchrun.sh"]
    code, out, err = _run(["estimate", "--from", *mg, "--gpu", "h100-sxm-80gb", "--grad-dtype", "bf16", "--json"],
                          capsys)
    assert code == 0, err
    assert json.loads(out)["plan"]["grad_dtype"] == "bf16"
    code, _, err = _run(["emit", *EST[1:], "--engine", "deepspeed", "--out", tmp_path / "ds"], capsys)
    assert code == 0, err
    code, _, err = _run(["estimate", "--from", tmp_path / "ds" / "ds_config.json", "--model", "llama3-8b",
                         "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--grad-dtype", "bf16"], capsys)
    assert code == 2 and "bf16 gradients are not modelled" in err and "Traceback" not in err
