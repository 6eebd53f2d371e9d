"""Checkpoint tiers and restart time by world size (autotune.cost.checkpoint_tiers).

- the rendezvous grows with the rank count (PyTorch's TCPStore benchmark: 100 s at 98,304 ranks);
- tier "local" (node-local storage + a replica on a peer node, Megatron-LM only): hand-derived save/load figures,
  a shorter restart and more frequent saves than the shared tier, durable saves still written;
- a tier the engine cannot use is an error when asked for with a flag (exit 2), a note when the cluster file
  offers it; a tier name the tool does not know is an error naming the field;
- the emitted megatron_args.sh with the local tier passes Megatron-LM's own parse_args/validate_args (the
  oracle, with nvidia-resiliency-ext installed into the test tooling).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tooling import tool_folder  # tests/ is on sys.path (no __init__)

from autotune.api import make_plan
from autotune.cli import main
from autotune.cost.checkpoint import checkpoint_policy
from autotune.cost.checkpoint_tiers import rendezvous_s
from autotune.cost.estimate import estimate
from autotune.cost.goodput import goodput
from autotune.emit.options import CheckpointOptions
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

REPO = Path(__file__).resolve().parents[2]
ORACLE = REPO.parent / "shared" / "oracles" / "megatron-lm" / "megatron_args_check.py"


def _cluster_file(tmp_path: Path, text: str = "") -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text("gpu: h100-sxm-80gb\nnum_gpus: 1024\n" + text)
    return path


def _megatron_70b(num_gpus: int = 1024):
    model = load_model_preset("llama3-70b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=num_gpus)
    plan = make_plan(model, cluster, engine="megatron", tp=8, pp=4, global_batch_size=512, seq_len=8192)
    return estimate(model, cluster, plan)


def test_rendezvous_grows_linearly_with_the_rank_count():
    assert rendezvous_s(98_304) == pytest.approx(100.0)  # the published point
    assert rendezvous_s(16_384) == pytest.approx(100 * 16_384 / 98_304)  # 16.7 s
    small, large = (checkpoint_policy(_megatron_70b(n), CheckpointOptions()) for n in (1024, 16_384))
    assert large.rendezvous_s - small.rendezvous_s == pytest.approx(rendezvous_s(16_384) - rendezvous_s(1024))
    for pol in (small, large):
        assert pol.restart_s == pytest.approx(pol.detection_s + pol.relaunch_s + pol.rendezvous_s + pol.load_time_s)


def test_local_tier_hand_derived_and_against_the_shared_tier():
    est = _megatron_70b()
    shared = checkpoint_policy(est, CheckpointOptions())
    local = checkpoint_policy(est, CheckpointOptions(tier="local", local_storage_bandwidth_gb_per_s=10.0))
    assert (shared.tier, shared.local, local.tier) == ("shared", None, "local")
    lt, per_rank, cluster = local.local, local.sizes.per_rank, est.cluster
    node_bytes = cluster.gpus_per_node * per_rank
    network = cluster.gpus_per_node * cluster.inter_node_bandwidth_gb_per_s * 1e9
    assert lt.node_bytes == pytest.approx(node_bytes)
    assert lt.write_s == pytest.approx(node_bytes / 10e9)
    assert lt.replicate_s == pytest.approx(node_bytes / network)  # one replica on one other node
    assert local.load_time_s == pytest.approx(max(node_bytes / 10e9, node_bytes / network))
    assert lt.replication_jump == cluster.gpus_per_node  # the replica lives on the next node
    # Reading one node's shards locally beats every rank reading the whole checkpoint from 5 GB/s shared storage.
    assert local.restart_s < shared.restart_s
    assert local.restart_s == pytest.approx(shared.restart_s - shared.load_time_s + local.load_time_s)
    # Cheaper restarts and a short persist lag: saves come at least as often; the durable saves keep the shared
    # tier's interval and its stall is counted.
    assert local.interval_steps <= shared.interval_steps
    assert local.durable_interval_steps == shared.interval_steps
    assert local.durable_blocking_s == pytest.approx(shared.blocking_s)
    fractions = local.wall_fractions
    assert sum(fractions.values()) == pytest.approx(1.0)
    assert fractions["restart"] < shared.wall_fractions["restart"]
    assert goodput(est, CheckpointOptions(tier="local")).goodput_tokens_per_s > goodput(est).goodput_tokens_per_s
    files = local.files()
    assert (files.interval_steps, files.local_interval_steps) == (shared.interval_steps, local.interval_steps)
    flags = files.megatron_flags()
    assert flags[flags.index("--non-persistent-ckpt-type") + 1] == "local"
    assert flags[flags.index("--replication-jump") + 1] == str(cluster.gpus_per_node)
    assert "Tier local" in local.to_text()


def test_a_tier_the_engine_cannot_use_is_an_error_when_asked_for(tmp_path, capsys):
    model = load_model_preset("llama3-70b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=1024)
    est = estimate(model, cluster, make_plan(model, cluster, engine="deepspeed", tp=8, zero_stage=1,
                                             global_batch_size=512, seq_len=8192))
    with pytest.raises(InputError, match="cannot use it, only Megatron-LM"):
        checkpoint_policy(est, CheckpointOptions(tier="local"))
    base = ["estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--seq-len", "8192",
            "--global-batch", "512", "--tp", "8"]
    assert main([*base, "--num-gpus", "1024", "--engine", "deepspeed", "--zero", "1",
                 "--checkpoint-tier", "local"]) == 2
    assert "--checkpoint-tier shared" in capsys.readouterr().err
    # One node: no peer node to hold the replica.
    assert main([*base, "--num-gpus", "8", "--engine", "megatron", "--checkpoint-tier", "local"]) == 2
    assert "node count divisible by 2, got 1 node(s)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main([*base, "--num-gpus", "1024", "--engine", "megatron", "--checkpoint-tier", "tape"])
    assert stop.value.code == 2 and "--checkpoint-tier" in capsys.readouterr().err


def test_the_cluster_file_offers_the_local_tier_and_plans_that_cannot_use_it_save_shared(tmp_path, capsys):
    cluster = _cluster_file(tmp_path, "checkpoint_tier: local\nlocal_storage_bandwidth_gb_per_s: 20\n")
    base = ["estimate", "--model", "llama3-70b", "--cluster", str(cluster), "--seq-len", "8192",
            "--global-batch", "512", "--tp", "8", "--json"]
    assert main([*base, "--engine", "megatron", "--pp", "4"]) == 0
    kept = json.loads(capsys.readouterr().out)["goodput"]
    assert kept["checkpoint_tier"] == "local" and kept["durable_interval_steps"] >= kept["interval_steps"]
    assert main([*base, "--engine", "deepspeed", "--zero", "1"]) == 0
    kept = json.loads(capsys.readouterr().out)["goodput"]
    assert kept["checkpoint_tier"] == "shared" and kept["durable_interval_steps"] is None
    # The flag wins over the file.
    assert main([*base, "--engine", "megatron", "--pp", "4", "--checkpoint-tier", "shared"]) == 0
    assert json.loads(capsys.readouterr().out)["goodput"]["checkpoint_tier"] == "shared"
    out = tmp_path / "ds"
    assert main(["emit", "--model", "llama3-70b", "--cluster", str(cluster), "--seq-len", "8192",
                 "--global-batch", "512", "--tp", "8", "--engine", "deepspeed", "--zero", "3", "--out", str(out)]) == 0
    assert "the cluster offers local storage, but checkpoint tier 'local'" in (out / "plan.md").read_text()
    assert "--non-persistent" not in (out / "plan.md").read_text()


@pytest.mark.parametrize("line,needle", [("checkpoint_tier: tape", "checkpoint_tier"),
                                         ("local_storage_bandwidth_gb_per_s: 0", "local_storage_bandwidth_gb_per_s")])
def test_bad_tier_figures_in_the_cluster_file_exit_2(tmp_path, capsys, line, needle):
    cluster = _cluster_file(tmp_path, line + "\n")
    assert main(["estimate", "--model", "llama3-8b", "--cluster", str(cluster)]) == 2
    assert needle in capsys.readouterr().err


def _nvrx_path() -> Path:
    """nvidia-resiliency-ext 0.4.1 (Megatron-LM's local checkpoint manager) installed into the test tooling."""
    return tool_folder("nvrx-0.4.1", ["nvidia-resiliency-ext==0.4.1"])


@pytest.mark.slow
@pytest.mark.skipif(not ORACLE.is_file(), reason=f"Megatron-LM oracle not found at {ORACLE} (it lives beside the "
                    "checkout, in ../shared; CI has it)")
def test_emitted_local_tier_flags_pass_megatron_lm(tmp_path):
    out = tmp_path / "job"
    cluster = _cluster_file(tmp_path, "checkpoint_tier: local\n")
    assert main(["emit", "--model", "llama3-70b", "--cluster", str(cluster), "--seq-len", "8192",
                 "--global-batch", "512", "--tp", "8", "--pp", "4", "--engine", "megatron", "--out", str(out)]) == 0
    args = (out / "megatron_args.sh").read_text()
    assert "--non-persistent-ckpt-type local" in args and "--replication-jump 8" in args
    def verdict(path: str) -> dict:
        # Stand-in: Megatron-LM d98e8a6 asserts nvidia-resiliency-ext >= its NVRX_MIN_VERSION (0.6.0) on import;
        # PyPI's newest for this Python is 0.4.1, whose local checkpoint manager (the module validate_args
        # imports) is the real one. The shim gives the package Megatron's minimum as its __version__.
        shim = ("import re, runpy, sys; from pathlib import Path; import nvidia_resiliency_ext as m; "
                "src = Path(sys.argv[1]).parent / 'megatron/core/dist_checkpointing/strategies/nvrx.py'; "
                "m.__version__ = re.search(r'NVRX_MIN_VERSION = \"([^\"]+)', src.read_text())[1]; "
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, str(REPO)]))
        done = subprocess.run([sys.executable, "-c", shim, str(ORACLE), "--world-size", "1024", "--args-file",
                               str(out / "megatron_args.sh")], capture_output=True, text=True, timeout=600, env=env)
        lines = done.stdout.strip().splitlines()
        assert lines, done.stderr[-2000:]
        return json.loads(lines[-1])

    accepted = verdict(str(_nvrx_path()))
    assert accepted["ok"], accepted


def test_the_ledger_shows_host_memory_at_a_save(capsys):
    """An asynchronous save stages every local rank's shard in pinned host memory: its own host row."""
    base = ["estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--tp", "8", "--pp", "2",
            "--global-batch", "512", "--seq-len", "8192", "--engine", "megatron"]
    assert main([*base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    staging = doc["goodput"]["staging_host_bytes_per_node"]
    est = _megatron_70b(64)
    pol = checkpoint_policy(estimate(est.model, est.cluster, make_plan(est.model, est.cluster, engine="megatron", tp=8,
                                                                       pp=2, global_batch_size=512, seq_len=8192)),
                            CheckpointOptions())
    assert staging == pytest.approx(8 * pol.sizes.per_rank) and staging > 0
    assert main(base) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "host at a save" in line)
    assert f"+{staging / 2**30:,.2f} GiB pinned checkpoint staging" in row
    assert main([*base, "--no-async-save"]) == 0
    assert "host at a save" not in capsys.readouterr().out  # a blocking save stages nothing
