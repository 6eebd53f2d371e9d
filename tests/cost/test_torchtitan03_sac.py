"""torchtitan 0.3's op-level selective AC keeps every Float8 GEMM's output (its save set is torch's compute-intensive
op list, which holds aten._scaled_mm; 0.2.2's _op_sac_save_list did not): the ledger and the recompute time of an
FP8 plan with selective recompute follow the release, from the command line and from a 0.3 module read back."""

from __future__ import annotations

import json

import pytest

from autotune.cli import main
from autotune.cost.activations import block_mms, op_sac_layer_bytes
from autotune.engines.facts import ActivationFacts
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

MODEL = load_model_preset("llama3-8b")


def _bytes(policy: str, **kw) -> float:
    plan = ParallelPlan(seq_len=8192, recompute="selective", **kw)
    return op_sac_layer_bytes(MODEL, plan, ActivationFacts(selective=policy, fp8_input_bytes=2,
                                                           gathered_linear_inputs=True))


def test_03_keeps_the_scaled_mm_outputs_and_02_recomputes_them():
    sb, h, f = 8192, MODEL.hidden_size, MODEL.ffn_hidden_size
    kept = sum(2 * sb * width for _, _, width in block_mms(MODEL))  # wq wk wv wo w1 w3 w2, bf16, tp 1
    assert kept == 2 * sb * (MODEL.q_width + 2 * MODEL.kv_width + h + 2 * f + h)
    abs_inputs = 2 * sb * (h + MODEL.attention_output_width + h + f)  # 0.2's model: the cast inputs' amax operands
    assert _bytes("op-sac-0.3", precision="fp8") - _bytes("op-sac", precision="fp8") == pytest.approx(
        kept - abs_inputs, rel=1e-12)
    # bf16: aten.mm, every second one kept, in both releases
    assert _bytes("op-sac-0.3") == _bytes("op-sac")


EST = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "fsdp", "--zero",
       "3", "--global-batch", "8", "--seq-len", "8192", "--recompute", "selective", "--loss-chunks", "8",
       "--fp8-recipe", "torchao-rowwise", "--json"]


def _run(argv, capsys) -> dict:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_the_release_reaches_the_ledger_and_the_recompute_time(capsys):
    fp8 = {v: _run([*EST, "--precision", "fp8", "--engine-version", f"fsdp={v}"], capsys) for v in ("0.2", "0.3")}
    bf16 = {v: _run([*EST[:-3], "--json", "--precision", "bf16", "--engine-version", f"fsdp={v}"], capsys)
            for v in ("0.2", "0.3")}
    assert fp8["0.2"]["plan"] == fp8["0.3"]["plan"]  # the same plan: only the release's code differs
    layers = MODEL.num_layers
    sb = 8192
    kept = sum(2 * sb * width for _, _, width in block_mms(MODEL))
    # 0.3 on FP8 vs 0.3 on bf16: the bf16 run keeps every second mm (wq, wv, w1, w2), the FP8 run all seven
    # outputs and no cast operands; other terms are the same
    every_second = sum(2 * sb * width for _, _, width in block_mms(MODEL)[0::2])
    assert fp8["0.3"]["memory"]["activation_parts"]["layers"] - bf16["0.3"]["memory"]["activation_parts"]["layers"] \
        == pytest.approx(layers * (kept - every_second), rel=1e-6)
    assert fp8["0.3"]["memory"]["total"] != pytest.approx(fp8["0.2"]["memory"]["total"], rel=1e-3)


def test_the_kept_gemm_outputs_are_not_rerun():
    from autotune.cost.step_time import TimeSettings, estimate_step_time
    from autotune.specs.loading import load_cluster

    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    for precision, faster in (("fp8", True), ("bf16", False)):
        plan = ParallelPlan(engine="fsdp", dp=8, zero_stage=3, seq_len=8192, global_batch_size=8,
                            recompute="selective", precision=precision)
        t = {p: estimate_step_time(MODEL, cluster, plan, TimeSettings(selective_policy=p)).step_time_s
             for p in ("op-sac", "op-sac-0.3")}
        assert (t["op-sac-0.3"] < t["op-sac"] * (1 - 1e-3)) is faster, t
        assert t["op-sac-0.3"] <= t["op-sac"]


def test_a_03_module_read_back_is_estimated_as_emitted(tmp_path, capsys):
    est = _run([*EST, "--precision", "fp8", "--engine-version", "fsdp=0.3"], capsys)
    code = main(["emit", *[str(a) for a in EST[1:-1]], "--precision", "fp8", "--engine-version", "fsdp=0.3",
                 "--out", str(tmp_path / "job")])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    back = _run(["estimate", "--from", tmp_path / "job" / "torchtitan_plan.py", "--gpu", "h100-sxm-80gb", "--json"],
                capsys)
    assert back["memory"]["total"] == pytest.approx(est["memory"]["total"], rel=1e-9)
    assert back["time"]["step_time_s"] == pytest.approx(est["time"]["step_time_s"], rel=1e-9)
