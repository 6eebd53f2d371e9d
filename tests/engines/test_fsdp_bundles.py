"""FSDP bundles train as emitted: `autotune emit --engine fsdp`, then `bash launch_torchrun.sh` run as written
(from another folder) on gloo ranks, through `python -m autotune.train` into torch's own FSDP2 / DTensor /
pipelining. Each run's first-step loss on rank 0 is checked against the same model and batch computed in this
process without any parallelism (bf16 weights, as MixedPrecisionPolicy casts them), so a wrong TP split,
pipeline split or data stream fails the test, not only a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.resources import data_path

STEPS = 6  # the dispatcher's defaults: 1 warm-up step + 5 measured


def _model_yaml(tmp: Path, layers: int, **fields) -> Path:
    """tiny-llama cut to ``layers`` layers, ``fields`` changed (a model YAML, as a user would write one)."""
    doc = yaml.safe_load((data_path("presets", "models/tiny-llama.yaml")).read_text())
    doc["name"], doc["num_layers"] = f"tiny-llama-{layers}l", layers
    doc.update(fields)
    path = tmp / "model.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _emit(tmp: Path, layers: int, num_gpus: int, *flags: str, **fields) -> Path:
    out = tmp / "bundle"
    cmd = [sys.executable, "-m", "autotune", "emit", "--model", str(_model_yaml(tmp, layers, **fields)), "--gpu", "cpu",
           "--num-gpus", str(num_gpus), "--gpus-per-node", str(num_gpus), "--engine", "fsdp", "--seq-len", "64",
           "--recompute", "none", "--out", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _run_bundle(bundle: Path, cwd: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(bundle / "launch_torchrun.sh")], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    steps = [ln for ln in proc.stdout.splitlines() if ln.startswith("STEP ")]
    assert len(steps) == STEPS
    return json.loads(lines[-1][len("RESULT "):])


def _reference_first_loss(bundle: Path) -> float:
    """Rank 0's first optimizer step loss, computed here on one process (same seed, same data stream 0)."""
    import torch

    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan
    from autotune.train import token_batches
    from autotune.workloads.transformer import build_model

    doc = json.loads((bundle / "plan.json").read_text())
    spec, plan = ModelSpec.from_dict(doc["model"]["spec"]), ParallelPlan(**doc["plan"])
    torch.manual_seed(1234)
    model = build_model(spec, seq_len=plan.seq_len, recompute="none", flash_attention=plan.flash_attention)
    batches = token_batches(spec.vocab_size, plan.micro_batch_size, plan.seq_len, seed=1234, stream=0,
                            device=torch.device("cpu"))
    with torch.no_grad():
        losses = [float(model(*next(batches))) for _ in range(plan.grad_accum_steps)]
    return sum(losses) / len(losses)


CASES = {
    # name: (layers, ranks, emit flags, expected mesh (pp, dp_replicate, dp_shard, tp))
    "full-shard": (2, 2, ["--zero", "3"], (1, 1, 2, 1)),
    "hybrid-2x2": (2, 4, ["--zero", "3", "--dp-replicate", "2"], (1, 2, 2, 1)),
    "fsdp-tp-sp": (2, 4, ["--zero", "3", "--tp", "2", "--sequence-parallel"], (1, 1, 2, 2)),
    "fsdp-tp": (2, 2, ["--zero", "3", "--tp", "2", "--no-sequence-parallel"], (1, 1, 1, 2)),
    "pipelining-1f1b-uneven": (3, 2, ["--zero", "2", "--pp", "2", "--global-batch", "2"], (2, 1, 1, 1)),
    "pipelining-interleaved": (4, 2, ["--zero", "3", "--pp", "2", "--vpp", "2", "--global-batch", "2"],
                               (2, 1, 1, 1)),
    # 2 layers on pp 2 x vpp 2 virtual stages, as torchtitan splits them: the first chunk the embedding alone, the
    # last the final norm + output alone (specs.layout.torchtitan_split)
    "pipelining-interleaved-embedding-alone": (2, 2, ["--zero", "3", "--pp", "2", "--vpp", "2", "--global-batch",
                                                      "2"], (2, 1, 1, 1)),
}


@pytest.mark.slow
@pytest.mark.usefixtures("default_port_taken")  # one-node torchrun runs --standalone: a free port, never 29500
@pytest.mark.parametrize("case", list(CASES))
def test_fsdp_bundle_trains_as_emitted(case, tmp_path):
    layers, ranks, flags, mesh = CASES[case]
    bundle = _emit(tmp_path, layers, ranks, *flags)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _run_bundle(bundle, elsewhere)
    assert result["engine"] == "fsdp" and result["world_size"] == ranks
    assert tuple(result["mesh"].values()) == mesh
    assert len(result["measured_step_times_s"]) == STEPS - 1 and result["tokens_per_s"] > 0
    assert result["losses"][0] == pytest.approx(_reference_first_loss(bundle), abs=5e-3)
    if case.startswith("pipelining"):
        assert result["pipeline_schedule"] == ("ScheduleInterleaved1F1B" if "interleaved" in case else "Schedule1F1B")
    plan_md = (bundle / "plan.md").read_text()
    assert "fully_shard(block" in plan_md and "MixedPrecisionPolicy" in plan_md


@pytest.mark.slow
def test_context_parallel_is_refused_with_its_reason(tmp_path):
    bundle = _emit(tmp_path, 2, 2, "--zero", "3", "--cp", "2")
    proc = subprocess.run([sys.executable, "-m", "autotune.train", "--plan", str(bundle / "plan.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "UNSUPPORTED context parallelism" in proc.stdout and "Traceback" not in proc.stderr
    assert "_scaled_dot_product_flash_attention_for_cpu" in proc.stdout


@pytest.mark.slow
@pytest.mark.usefixtures("default_port_taken")
def test_op_level_sac_under_tp_trains_as_without_recompute(tmp_path):
    """Selective recompute is torchtitan's op-level SAC (gate and up as two GEMMs on each TP rank's shard): the
    same losses as the same bundle without recompute while the updates move them, so the same gradients."""
    losses = {}
    for recompute in ("none", "selective"):
        (tmp_path / recompute).mkdir()
        bundle = _emit(tmp_path / recompute, 2, 2, "--zero", "3", "--tp", "2", "--no-sequence-parallel",
                       "--recompute", recompute, "--lr", "1e-2", "--warmup-steps", "0")
        result = _run_bundle(bundle, tmp_path / recompute)
        assert result["recompute"] == recompute
        losses[recompute] = result["losses"]
    assert "create_selective_checkpoint_contexts" in (bundle / "plan.md").read_text()
    # lr 1e-2 from the first step: the second and third losses move by the updates (a TP gradient that misses its
    # all-reduce: 8e-2 off at the third); later steps diverge with bf16 noise alone
    assert losses["selective"][:3] == pytest.approx(losses["none"][:3], abs=1e-2)


@pytest.mark.slow
@pytest.mark.usefixtures("default_port_taken")
def test_the_plans_loss_chunks_reach_the_trainer_and_train_as_unchunked(tmp_path):
    """torchtitan 0.3's bundles chunk the loss (--loss-chunks, ChunkedLossWrapper): the built-in trainer runs the
    output layer and the loss in that many chunks (FSDP2, the head its own group) with the losses of the unchunked
    run while the updates move them (2 accumulation steps: a head gradient missing the 1/2 scale moves the second)."""
    results = {}
    for chunks in (1, 4):
        (tmp_path / str(chunks)).mkdir()
        bundle = _emit(tmp_path / str(chunks), 2, 2, "--zero", "3", "--global-batch", "4", "--engine-version",
                       "fsdp=0.3", "--loss-chunks", str(chunks), "--lr", "1e-2", "--warmup-steps", "0")
        assert json.loads((bundle / "plan.json").read_text())["plan"]["loss_chunks"] == chunks
        results[chunks] = _run_bundle(bundle, tmp_path / str(chunks))
    assert results[4]["loss_chunks"] == 4 and results[1]["loss_chunks"] == 1
    unchunked, chunked = results[1]["losses"], results[4]["losses"]
    assert chunked[0] == pytest.approx(unchunked[0], rel=1e-5)  # the same loss, summed by chunks
    assert chunked[:3] == pytest.approx(unchunked[:3], abs=1e-2)  # the same gradients (bf16 noise apart)


@pytest.mark.slow
@pytest.mark.usefixtures("default_port_taken")
def test_per_head_qk_norm_under_tp_trains_as_one_process(tmp_path):
    """Qwen3's Q/K norm (one weight of head_dim, after the ColwiseParallel Q/K: each rank normalises its own
    heads) trains under DTensor TP with the loss of the unsplit model."""
    bundle = _emit(tmp_path, 2, 2, "--zero", "3", "--tp", "2", "--no-sequence-parallel", qk_norm="head",
                   name="tiny-qwen3-2l")
    result = _run_bundle(bundle, tmp_path)
    assert tuple(result["mesh"].values()) == (1, 1, 1, 2)
    assert result["losses"][0] == pytest.approx(_reference_first_loss(bundle), abs=5e-3)


@pytest.mark.slow
@pytest.mark.usefixtures("default_port_taken")
def test_gemma_layers_under_tp_train_as_one_process(tmp_path):
    """Gemma 2's layer (four (1 + weight) norms, GeGLU, capped attention scores and logits, the query scale, scaled
    embeddings) trains under DTensor TP, its post-norms on each rank's replicated sublayer output, with the loss of
    the unsplit model."""
    bundle = _emit(tmp_path, 2, 2, "--zero", "3", "--tp", "2", "--no-sequence-parallel", name="tiny-gemma2-2l",
                   activation="geglu", norms_per_layer=4, norm_zero_centered=True, scaled_embeddings=True,
                   attn_logit_softcap=0.5, final_logit_softcap=2.0, query_pre_attn_scalar=24.0)
    result = _run_bundle(bundle, tmp_path)
    assert tuple(result["mesh"].values()) == (1, 1, 1, 2)
    assert result["losses"][0] == pytest.approx(_reference_first_loss(bundle), abs=5e-3)
