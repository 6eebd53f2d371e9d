"""The fallback plan (issue 19 item 4): the best plan of the same engine on the GPUs left after losing a node,
written into the bundle under fallback/ with resume_fallback.sh and a plan.md section."""

from __future__ import annotations

import json
import subprocess

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import write_bundle
from autotune.cli import main
from autotune.search.fallback import fallback_plan
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model


def _estimate(engine="deepspeed", num_gpus=16, **kw):
    model, cluster = load_model("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=num_gpus)
    kw = {"zero_stage": 2, "micro_batch_size": 1, "global_batch_size": 64, "recompute": "selective", **kw}
    return estimate(model, cluster, make_plan(model, cluster, seq_len=4096, engine=engine, **kw))


def test_the_fallback_is_the_best_plan_of_the_engine_on_one_node_less():
    est = _estimate()
    fb = fallback_plan(est)
    assert (fb.lost_gpus, fb.num_gpus) == (8, 8) and fb.estimate is not None
    plan = fb.estimate.plan
    assert (plan.engine, plan.global_batch_size, plan.seq_len, plan.precision) == ("deepspeed", 64, 4096, "bf16")
    assert plan.world_size == 8 and fb.estimate.fits
    smaller = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    best = search_plans(est.model, smaller, seq_len=4096, global_batch_size=64, top_k=1,
                        constraints=SearchConstraints(engines=("deepspeed",), precisions=("bf16",),
                                                      zero_stages=(1, 2, 3))).candidates[0]
    assert fb.estimate.time.tokens_per_s == pytest.approx(best.time.tokens_per_s)
    assert "ds_to_universal" in fb.conversion
    assert plan.zero_stage >= 1  # a universal checkpoint loads into a ZeRO optimizer only (RESUMES_INTO)


@pytest.mark.parametrize("lost,needle", [(16, "nothing to resume on"), (4, "not whole nodes")])
def test_no_fallback_says_why(lost, needle):
    fb = fallback_plan(_estimate(), lost_gpus=lost)
    assert fb.estimate is None and needle in fb.reason


def test_megatron_and_dcp_need_no_conversion():
    assert "no conversion" in fallback_plan(_estimate("megatron", zero_stage=1, tp=2)).conversion
    assert "reshards on load" in fallback_plan(_estimate("fsdp", zero_stage=3)).conversion


def test_the_bundle_carries_the_fallback_and_its_resume_script(tmp_path):
    est = _estimate()
    fb = fallback_plan(est)
    out = tmp_path / "job"
    paths = write_bundle(est, out, fallback=fb)
    assert out / "fallback" / "ds_config.json" in paths and out / "resume_fallback.sh" in paths
    main_cfg = json.loads((out / "ds_config.json").read_text())
    fallback_cfg = json.loads((out / "fallback" / "ds_config.json").read_text())
    assert main_cfg["checkpoint"]["load_universal"] is False and fallback_cfg["checkpoint"]["load_universal"] is True
    assert fallback_cfg["train_batch_size"] == 64 and json.loads((out / "fallback" / "plan.json").read_text())[
        "plan"]["dp"] == fb.estimate.plan.dp
    md = (out / "plan.md").read_text()
    assert "## If 8 GPUs are lost: the fallback plan" in md and "`resume_fallback.sh`:" in md
    assert json.loads((out / "plan.json").read_text())["fallback"]["plan"] == fb.estimate.plan.to_dict()
    # The resume script refuses to run with nothing saved (exit 2, says where it looked), never a half step.
    proc = subprocess.run(["bash", str(out / "resume_fallback.sh")], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "SAVE_DIR": str(tmp_path / "nothing")}, timeout=30)
    assert proc.returncode == 2 and "nothing saved yet" in proc.stderr
    # Replacing the bundle: fallback/ is emit's own folder, not kept aside; a user's file inside it is.
    notes: list[str] = []
    write_bundle(est, out, fallback=fb, force=True, notes=notes)
    assert notes == []
    (out / "fallback" / "my_notes.txt").write_text("mine")
    write_bundle(est, out, fallback=fb, force=True, notes=notes)
    assert len(notes) == 1 and "fallback/my_notes.txt" in notes[0]


def test_emit_writes_the_fallback_unless_told_not_to(tmp_path, capsys):
    base = ["emit", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--engine", "megatron",
            "--zero", "1", "--global-batch", "64", "--seq-len", "4096"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert "fallback/megatron_args.sh" in capsys.readouterr().out
    assert main([*base, "--out", str(tmp_path / "b"), "--lost-gpus", "0"]) == 0
    assert not (tmp_path / "b" / "fallback").exists() and not (tmp_path / "b" / "resume_fallback.sh").exists()
    with pytest.raises(SystemExit) as raised:
        raise SystemExit(main([*base, "--out", str(tmp_path / "c"), "--lost-gpus", "-1"]))
    assert raised.value.code == 2 and "--lost-gpus" in capsys.readouterr().err


def test_switch_times_conversion_for_deepspeed_only():
    """ds_to_universal reads and writes the checkpoint once through one node; DCP / torch_dist reshard on load."""
    from autotune.cost.checkpoint import checkpoint_bytes
    from autotune.search.fallback import switch_times

    est = _estimate()
    total = checkpoint_bytes(est.model, est.plan).total
    one_node = min(5e9, est.cluster.gpus_per_node * est.cluster.inter_node_bandwidth_gb_per_s * 1e9)
    assert switch_times(est, 5.0) == pytest.approx((2 * total / one_node, total / 5e9))
    fb = fallback_plan(est, storage_bandwidth_gb_per_s=5.0)
    assert (fb.conversion_s, fb.load_s) == pytest.approx(switch_times(est, 5.0))
    fsdp = _estimate("fsdp", zero_stage=3)
    conversion, load = switch_times(fsdp, 5.0)
    assert conversion == 0 and load == pytest.approx(checkpoint_bytes(fsdp.model, fsdp.plan).total / 5e9)
    # Faster storage: the conversion is bounded by one node's links, the load by the storage.
    fast = switch_times(est, 10_000.0)
    assert fast[0] == pytest.approx(2 * total / (est.cluster.gpus_per_node * est.cluster.inter_node_bandwidth_gb_per_s
                                                 * 1e9))
    assert fast[1] == pytest.approx(total / 1e13)
