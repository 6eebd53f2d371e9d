"""The loss's time follows its kernel (autotune.cost.loss_kernel): Transformer Engine's fused cross entropy moves 10
HBM bytes a logit (two reads and an in-place gradient write forward, a read and write to scale it backward), the
fp32 softmax 26; only the last pipeline stage carries it, and the CLI's --cross-entropy sets time and memory alike."""

import json

import pytest

from autotune.api import make_plan
from autotune.cli import main
from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.kernels import rates
from autotune.cost.loss_kernel import FP32_SOFTMAX_BYTES, TE_FUSED_BYTES, loss_bytes_per_logit
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

MODEL = load_model_preset("llama3-70b")
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=64)


def _stages(te: bool | None, **kw):
    plan = make_plan(MODEL, CLUSTER, engine="megatron", tp=4, pp=4, seq_len=8192, micro_batch_size=1,
                     global_batch_size=128, precision="bf16", **kw)
    est = estimate_step_time(MODEL, CLUSTER, plan, TimeSettings(te_cross_entropy=te))
    return plan, est, {stage: s for stage, _, s in est.stage_times_s}


def test_bytes_per_logit_by_kernel():
    assert loss_bytes_per_logit(True) == TE_FUSED_BYTES == 10
    assert loss_bytes_per_logit(False) == loss_bytes_per_logit(None) == FP32_SOFTMAX_BYTES == 26


def test_the_fused_loss_takes_16_bytes_a_logit_less_on_the_last_stage_only():
    plan, fp32, fp32_stages = _stages(None)
    _, te, te_stages = _stages(True)
    _, stated_fp32, stated_stages = _stages(False)
    assert stated_stages == fp32_stages and stated_fp32.tokens_per_s == fp32.tokens_per_s  # fp32 is the default
    last = plan.pp - 1
    hbm = _hbm(CLUSTER)
    logits = plan.seq_len * plan.micro_batch_size * MODEL.vocab_size / plan.tp  # per micro-batch on this GPU
    assert fp32_stages[last] - te_stages[last] == pytest.approx((26 - 10) * logits / hbm, rel=1e-9)
    assert {s: t for s, t in te_stages.items() if s != last} == {s: t for s, t in fp32_stages.items() if s != last}
    assert te.tokens_per_s > fp32.tokens_per_s


def _estimate_json(capsys, *extra):
    argv = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "megatron",
            "--tp", "1", "--pp", "1", "--seq-len", "8192", "--global-batch", "64", "--micro-batch", "1",
            "--json", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_flag_sets_the_loss_time_and_its_memory(capsys):
    plain = _estimate_json(capsys)
    te = _estimate_json(capsys, "--cross-entropy", "te")
    fp32 = _estimate_json(capsys, "--cross-entropy", "fp32")
    assert fp32["time"]["step_time_s"] == pytest.approx(plain["time"]["step_time_s"], rel=1e-12)
    tokens = 64 * 8192 / 8  # per GPU and step (dp 8)
    saved = tokens * 16 * 128256 / _hbm(load_cluster(gpu="h100-sxm-80gb", num_gpus=8))
    assert plain["time"]["compute_s"] - te["time"]["compute_s"] == pytest.approx(saved, rel=1e-6)
    assert te["memory"]["activations"] < plain["memory"]["activations"]  # 2 bytes a logit kept, not 4


def _hbm(cluster) -> float:
    """The memory-bound kernels' bytes/s (the precision and kernels do not change it)."""
    return rates(cluster, "bf16", DEFAULT_EFFICIENCY, "fa3", None).hbm


def test_the_estimate_names_the_loss_it_costed(capsys):
    plain = _estimate_json(capsys)["assumed_settings"]
    te = _estimate_json(capsys, "--cross-entropy", "te")["assumed_settings"]
    assert "loss an fp32 softmax of the logits (26 HBM bytes a logit)" in plain
    assert "loss Transformer Engine's fused cross entropy (10 HBM bytes a logit) (--cross-entropy)" in te
