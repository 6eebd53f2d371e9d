"""The whole 16-bit model the Hugging Face Trainer writes from rank 0 at every save (issue 19: the memory a save
costs, the "gather or shard" pitfall): its stall, node 0's host memory at a save as a ledger row, the ZeRO-3
gather turned off (and written so into ds_config_hf.json) where node 0 cannot hold it. The Trainer's own
behaviour with the flag either way is checked by a real run in tests/engines/test_hf_consolidated_save.py."""

from __future__ import annotations

import json

import pytest

from autotune.api import estimate, make_plan
from autotune.cli import main
from autotune.cost.consolidated_save import SAFETENSORS_SHARD_BYTES
from autotune.cost.goodput import goodput
from autotune.emit.options import CheckpointOptions
from autotune.specs.hardware import GB
from autotune.specs.loading import load_cluster, load_model

CLUSTER = ("gpu: h100-sxm-80gb\nnum_nodes: 4\ngpus_per_node: 8\nintra_node_bandwidth_gb_per_s: 450\n"
           "inter_node_bandwidth_gb_per_s: 50\nhost_memory_gib_per_node: {host}\n")


def _cluster(tmp_path, host_gib: int):
    path = tmp_path / f"cluster{host_gib}.yaml"
    path.write_text(CLUSTER.format(host=host_gib))
    return path


def _policy(tmp_path, engine: str, zero: int, host_gib: int = 1024, **kw):
    model, cluster = load_model("llama3-70b"), load_cluster(cluster_path=_cluster(tmp_path, host_gib))
    plan = make_plan(model, cluster, seq_len=4096, global_batch_size=64, micro_batch_size=1, engine=engine,
                     zero_stage=zero, recompute="full", **kw)
    return model, goodput(estimate(model, cluster, plan), CheckpointOptions(storage_bandwidth_gb_per_s=5.0)).policy


def test_the_trainer_writes_the_whole_model_from_rank_0_at_every_save(tmp_path):
    model, hf = _policy(tmp_path, "hf", 3)
    _, ds = _policy(tmp_path, "deepspeed", 3)
    whole = 2 * model.num_params  # bf16
    assert hf.sizes.consolidated_bytes == pytest.approx(whole, rel=1e-9) and ds.sizes.consolidated_bytes == 0
    assert hf.gather_16bit_weights_on_model_save and hf.consolidation_host_bytes == pytest.approx(whole, rel=1e-9)
    # Stall: the ZeRO-3 gather over 4 nodes (50 GB/s per GPU) + one writer (min(storage 5, link 50) GB/s).
    assert hf.consolidation_s == pytest.approx(whole / (50 * GB) + whole / (5 * GB), rel=1e-9)
    assert hf.blocking_s == pytest.approx(ds.blocking_s + hf.consolidation_s, rel=1e-9)
    assert hf.storage_bytes == pytest.approx(hf.keep_last * (hf.sizes.total + whole), rel=1e-9)
    assert hf.load_time_s == pytest.approx(ds.load_time_s, rel=1e-9)  # a resume does not read it back
    assert hf.host_at_save[0] == hf.consolidation_host_bytes and "node 0" in hf.host_at_save[1]
    assert "16-bit model from rank 0" in hf.to_text()


def test_zero_2_serialises_one_safetensors_file_at_a_time(tmp_path):
    model, hf = _policy(tmp_path, "hf", 2, offload_optimizer="cpu")
    assert hf.consolidation_host_bytes == pytest.approx(min(2 * model.num_params, SAFETENSORS_SHARD_BYTES))
    assert hf.consolidation_s == pytest.approx(2 * model.num_params / (5 * GB), rel=1e-9)  # no gather: whole


def test_node_0_without_room_turns_the_gather_off_and_the_config_says_so(tmp_path, capsys):
    _, tight = _policy(tmp_path, "hf", 3, host_gib=128)
    assert not tight.gather_16bit_weights_on_model_save and tight.consolidation_s == 0
    assert tight.sizes.consolidated_bytes == 0 and tight.host_at_save == (0.0, "")
    assert "zero_to_fp32.py" in tight.save_memory_note and tight.save_memory_note in tight.notes
    for host, gathered in ((128, False), (1024, True)):
        out = tmp_path / f"job{host}"
        assert main(["emit", "--model", "llama3-70b", "--cluster", str(_cluster(tmp_path, host)), "--engine", "hf",
                     "--zero", "3", "--global-batch", "64", "--seq-len", "4096", "--micro-batch", "1", "--recompute",
                     "full", "--out", str(out)]) == 0
        zero = json.loads((out / "ds_config_hf.json").read_text())["zero_optimization"]
        assert zero["stage3_gather_16bit_weights_on_model_save"] is gathered
        assert ("stage3_gather_16bit_weights_on_model_save is off" in (out / "plan.md").read_text()) is not gathered
    capsys.readouterr()
    assert main(["estimate", "--model", "llama3-70b", "--cluster", str(_cluster(tmp_path, 1024)), "--engine", "hf",
                 "--zero", "3", "--global-batch", "64", "--seq-len", "4096", "--micro-batch", "1", "--recompute",
                 "full"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("host at a save"))
    assert "131.42" in row and "on node 0" in row  # 70.6e9 params x 2 bytes = 131.4 GiB
