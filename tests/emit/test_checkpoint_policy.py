"""Checkpoint policy: sizes, the availability-optimal interval, async blocking cost, emitted keys/flags, keep_last pruning."""

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import yaml

from autotune.api import estimate, make_plan
from autotune.cost.checkpoint import (
    DEFAULT_RELAUNCH_S,
    checkpoint_bytes,
    checkpoint_policy,
    young_daly_interval_s,
)
from autotune.emit.checkpoint import prune_old_tags
from autotune.emit.options import CheckpointOptions
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import cluster_defaults, load_gpu_preset, load_model_preset

REFERENCE = Path("/work/shared/reference")

# Llama-2-70B: 68,976,648,192 parameters. With tp = 8 (pp = 1) one rank holds
#   tp-sharded / 8 + replicated = (68,451,041,280 layers + 524,288,000 embedding/output) / 8
#                                 + 1,318,912 norms = 8,623,235,072 parameters.
PSI = 68_976_648_192
RANK_PARAMS = 8_623_235_072


def _cluster():
    return ClusterSpec(gpu=load_gpu_preset("h100-sxm-80gb"), num_nodes=8, **cluster_defaults("h100-sxm-80gb"))


def _estimate(step_time_s=10.0, **plan):
    """Llama-2-70B on 64 H100s (PCIe 50 GB/s), tp 8 x dp 8, with a fixed step time."""
    model, cluster = load_model_preset("llama2-70b"), _cluster()
    p = make_plan(model, cluster, tp=8, global_batch_size=64, seq_len=4096, **{"zero_stage": 1, **plan})
    est = estimate(model, cluster, p)
    return dataclasses.replace(est, time=dataclasses.replace(est.time, step_time_s=step_time_s))


def test_rank_params_hand_derived():
    model = load_model_preset("llama2-70b")
    assert model.num_params == PSI
    est = _estimate()
    assert est.plan.dp == 8 and est.plan.tp == 8


def test_sizes_70b_deepspeed_zero1():
    s = checkpoint_bytes(load_model_preset("llama2-70b"), _estimate().plan)
    # DP rank 0 writes its TP shard's 16-bit weights (mp_rank_XX_model_states.pt) and its 1/8 of the
    # fp32 master + Adam moments (12 B/param).
    assert s.weight_bytes_per_rank == 2 * RANK_PARAMS == 17_246_470_144
    assert s.optimizer_bytes_per_rank == 12 * RANK_PARAMS / 8 == 12_934_852_608
    # Whole job: 16-bit weights once (2 Psi) + optimizer once (12 Psi) = 14 Psi = 965.7 GB.
    assert s.weight_bytes_total == 2 * PSI
    assert s.optimizer_bytes_total == 12 * PSI
    assert s.total == 14 * PSI == 965_673_074_688


def test_sizes_70b_deepspeed_zero3_has_no_16bit_weights():
    # ZeRO-3 writes only the fp32/optimizer partitions (measured: 12.1 B/param on DeepSpeed 0.19.8,
    # tests/integration/test_checkpoint_resume.py); 16-bit weights are rebuilt on load.
    s = checkpoint_bytes(load_model_preset("llama2-70b"), _estimate(zero_stage=3).plan)
    assert s.weight_bytes_per_rank == 0 and s.weight_bytes_total == 0
    assert s.optimizer_bytes_per_rank == 12_934_852_608
    assert s.total == 12 * PSI


def test_sizes_megatron_fully_parallel_save_spreads_everything():
    # torch_dist fully parallel save: every tensor once over the 8 DP ranks: (2 + 12) * 8,623,235,072 / 8.
    s = checkpoint_bytes(load_model_preset("llama2-70b"), _estimate(engine="megatron").plan)
    assert s.per_rank == 14 * RANK_PARAMS / 8 == 15_090_661_376
    assert s.total == 14 * PSI


def test_offload_does_not_change_what_is_saved():
    model = load_model_preset("llama2-70b")
    plain = checkpoint_bytes(model, _estimate(zero_stage=3).plan)
    offloaded = checkpoint_bytes(model, _estimate(zero_stage=3, offload_optimizer="cpu", offload_param="cpu").plan)
    assert offloaded == plain


def test_young_daly_first_order():
    # delta = 60 s, M = 10 h = 36,000 s: sqrt(2 * 60 * 36,000) - 60 = 2,078.46 - 60 = 2,018.46 s.
    assert young_daly_interval_s(60.0, 36_000.0) == pytest.approx(math.sqrt(2 * 60 * 36_000) - 60)
    assert young_daly_interval_s(60.0, 36_000.0) == pytest.approx(2018.46, abs=0.01)
    assert young_daly_interval_s(100.0, 40.0) == 40.0  # delta >= 2M: checkpoint every MTBF (Daly 2006)


def _options_for(delta_s, mtbf_h, num_gpus=64, **kw):
    """Storage bandwidth giving a write of ``delta_s`` for 14 Psi; GPU MTBF giving a job MTBF of ``mtbf_h``."""
    return CheckpointOptions(storage_bandwidth_gb_per_s=14 * PSI / delta_s / 1e9, gpu_mtbf_hours=mtbf_h * num_gpus,
                             async_save=False, **kw)


def test_policy_interval_and_expected_loss_hand_derived():
    pol = checkpoint_policy(_estimate(step_time_s=10.0), _options_for(60.0, 10.0))
    assert pol.write_time_s == pytest.approx(60.0)
    assert pol.blocking_s == pytest.approx(60.0)  # synchronous: the whole write blocks
    assert pol.job_mtbf_s == pytest.approx(36_000.0)
    # Availability optimum: tau = sqrt(delta^2 + 2 delta a M), a = 1 + R/M + R'/P; a failure's restart R = detection
    # (412 of Llama 3's 419 failures crash, seen in ~5 s; 7 hang until the 600 s NCCL watchdog: 14.9 s) + 300 s
    # relaunch + the rendezvous of 64 ranks (PyTorch's TCPStore: 100 s at 98,304 ranks, linear) + 60 s read; a
    # planned one's R' = 300 + rendezvous + 60 s (no detection); P = Llama 3's 47 planned interruptions in 54 days on
    # 16,384 GPUs, scaled to 64 GPUs.
    detection = (412 * 5 + 7 * 600) / 419
    rendezvous = 100 * 64 / 98_304
    restart = detection + DEFAULT_RELAUNCH_S + rendezvous + 60
    planned_restart = DEFAULT_RELAUNCH_S + rendezvous + 60
    planned = 16_384 * 54 * 24 / 47 * 3600 / 64
    a = 1 + restart / 36_000 + planned_restart / planned
    assert pol.detection_s == pytest.approx(detection) and pol.restart_s == pytest.approx(restart)
    assert pol.rendezvous_s == pytest.approx(rendezvous)
    assert pol.optimal_interval_s == pytest.approx(math.sqrt(60**2 + 2 * 60 * a * 36_000))  # 2,093.9 s
    assert pol.optimal_interval_s > young_daly_interval_s(60.0, 36_000.0)  # 2,018.5 s: a restart costs more
    assert pol.interval_steps == 209  # round(2,089.7 s / 10 s)
    assert pol.interval_s == pytest.approx(2090.0)
    # Wall time per cycle of c = 2,090 + 60 s: c + c/M (c/2 + R) + c/P R; each part a share of it.
    c = 2150.0
    wall = c + c / 36_000 * (c / 2 + restart) + c / planned * planned_restart
    parts = pol.loss_parts
    assert parts["checkpoint"] == pytest.approx(60 / wall)
    assert parts["rework"] == pytest.approx(c / 36_000 * c / 2 / wall)
    assert parts["restart"] == pytest.approx(c / 36_000 * restart / wall)
    assert parts["planned"] == pytest.approx(c / planned * planned_restart / wall)
    assert pol.expected_loss_fraction == pytest.approx(1 - 2090 / wall)  # 7.0%


def test_job_mtbf_is_gpu_mtbf_over_gpus():
    pol = checkpoint_policy(_estimate(), CheckpointOptions(gpu_mtbf_hours=50_000))
    assert pol.job_mtbf_s == pytest.approx(50_000 * 3600 / 64)  # 781.25 h


def test_interval_override():
    pol = checkpoint_policy(_estimate(engine="megatron"), CheckpointOptions(interval_steps=500))
    assert pol.interval_steps == 500 and pol.interval_overridden
    flags = pol.files().megatron_flags()
    assert flags[flags.index("--save-interval") + 1] == "500"
    assert "set by hand" in pol.to_text()


def test_bad_options_reported_at_once():
    with pytest.raises(InputError) as err:
        checkpoint_policy(_estimate(), CheckpointOptions(storage_bandwidth_gb_per_s=0, keep_last=0))
    assert len(err.value.problems) == 2


def test_interval_is_at_least_one_step():
    pol = checkpoint_policy(_estimate(step_time_s=1e9), CheckpointOptions(async_save=False))
    assert pol.interval_steps == 1


def test_async_blocks_only_for_the_device_to_host_copy():
    sync = checkpoint_policy(_estimate(engine="megatron"), CheckpointOptions(async_save=False))
    asyn = checkpoint_policy(_estimate(engine="megatron"), CheckpointOptions(async_save=True))
    # 965.7 GB at 5 GB/s = 193.1 s blocks without async; with it, 15.09 GB per rank over 50 GB/s PCIe = 0.30 s.
    assert sync.blocking_s == pytest.approx(965.673074688 / 5)
    assert asyn.blocking_s == pytest.approx(15.090661376 / 50)
    assert asyn.write_time_s == sync.write_time_s
    assert asyn.interval_steps < sync.interval_steps
    assert asyn.interval_s >= asyn.write_time_s  # never start a save before the previous write is done
    # Rework adds the write time (the checkpoint in flight is not yet durable).
    c = asyn.interval_s + asyn.blocking_s
    wall = asyn.interval_s / asyn.wall_fractions["train"]
    assert asyn.loss_parts["rework"] == pytest.approx(c / asyn.job_mtbf_s * (c / 2 + asyn.write_time_s) / wall)


def test_deepspeed_async_request_falls_back_to_synchronous():
    pol = checkpoint_policy(_estimate(), CheckpointOptions(async_save=True))
    assert not pol.async_save and pol.blocking_s == pol.write_time_s
    assert any("synchronously" in n for n in pol.notes)


def test_megatron_flags():
    pol = checkpoint_policy(_estimate(engine="megatron"), CheckpointOptions(save_dir="/ckpt", async_save=True))
    flags = pol.files().megatron_flags()
    assert flags[:8] == ["--save", "/ckpt", "--load", "/ckpt", "--save-interval", str(pol.interval_steps),
                         "--ckpt-format", "torch_dist"]
    # Megatron silently drops --async-save without the persistent worker (arguments.py:1817): both or neither.
    assert "--async-save" in flags and "--use-persistent-ckpt-worker" in flags
    plain = checkpoint_policy(_estimate(engine="megatron"), CheckpointOptions(async_save=False)).files().megatron_flags()
    assert "--async-save" not in plain and "--use-persistent-ckpt-worker" not in plain
    if (REFERENCE / "megatron_flags.json").exists():
        known = {f for entry in json.loads((REFERENCE / "megatron_flags.json").read_text())["flags"]
                 for f in entry["flags"]}
        assert {f for f in flags if f.startswith("--")} <= known


def _dotted(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _dotted(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_ds_checkpoint_block_keys_exist_in_deepspeed_0_19_8():
    pol = checkpoint_policy(_estimate(pp=2, engine="megatron-deepspeed"), CheckpointOptions())
    block = pol.files().ds_checkpoint_block()
    assert block["parallel_write"]["pipeline_stage"] is True  # pp > 1
    assert checkpoint_policy(_estimate(), CheckpointOptions()).files().ds_checkpoint_block()["parallel_write"] == {
        "pipeline_stage": False}
    assert pol.files().ds_checkpoint_block(load_universal=True)["load_universal"] is True
    paths = {f"checkpoint.{p}" for p in _dotted(block)}
    assert paths == {"checkpoint.tag_validation", "checkpoint.load_universal", "checkpoint.use_node_local_storage",
                     "checkpoint.parallel_write.pipeline_stage"}
    ref = REFERENCE / "deepspeed_keys.yaml"
    if not ref.exists():
        pytest.skip("shared reference deepspeed_keys.yaml not present")
    known = {k["path"] for k in yaml.safe_load(ref.read_text())["keys"]}
    assert paths <= known


def test_ds_blocks_parse_with_deepspeed():
    from deepspeed.runtime.config import DeepSpeedConfig

    pol = checkpoint_policy(_estimate(pp=2, engine="megatron-deepspeed"), CheckpointOptions())  # ZeRO-1 (ZeRO-3 forbids pp > 1)
    zero = {"stage": 3, **checkpoint_policy(_estimate(zero_stage=3), CheckpointOptions()).files().ds_zero_options()}
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    cfg = DeepSpeedConfig({"train_batch_size": 1, "checkpoint": pol.files().ds_checkpoint_block(load_universal=True),
                           "zero_optimization": zero})  # zero_optimization rejects unknown keys
    assert cfg.checkpoint_tag_validation_enabled and cfg.checkpoint_tag_validation_fail
    assert cfg.load_universal_checkpoint is True and cfg.use_node_local_storage is False
    assert cfg.checkpoint_parallel_write_pipeline is True
    assert cfg.zero_config.gather_16bit_weights_on_model_save is True
    assert checkpoint_policy(_estimate(), CheckpointOptions()).files().ds_zero_options() == {}


def test_resume_notes():
    ds = checkpoint_policy(_estimate(), CheckpointOptions(save_dir="/ck")).resume_command_note()
    assert "engine.load_checkpoint('/ck')" in ds and "latest" in ds and "ds_to_universal" in ds
    assert "load_universal: true" in ds
    mg = checkpoint_policy(_estimate(engine="megatron"), CheckpointOptions(save_dir="/ck")).resume_command_note()
    assert "--load /ck" in mg and "torch_dist" in mg


def test_to_text_and_to_dict():
    pol = checkpoint_policy(_estimate(step_time_s=10.0), _options_for(60.0, 10.0))
    text = pol.to_text()
    # 14 Psi = 965,673,074,688 B = 899.4 GiB; largest rank 30,181,322,752 B = 28.1 GiB; 209 steps = 34.8 min.
    for part in ("899.4 GiB", "28.1 GiB", "every 209 steps (34.8 min", "fail every 10.0 h", "keep the last 3",
                 f"{100 * pol.expected_loss_fraction:.2f}%"):
        assert part in text, part
    d = json.loads(json.dumps(pol.to_dict()))
    assert d["interval_steps"] == 209 and d["sizes"]["total"] == 14 * PSI
    assert d["storage_bytes"] == 3 * 14 * PSI


# ---- keep_last pruning ---------------------------------------------------------------------------
def _fake_tag(root: Path, name: str, files=("mp_rank_00_model_states.pt",)):
    (root / name).mkdir()
    for f in files:
        (root / name / f).write_bytes(b"x")


def test_prune_keeps_exactly_k_newest(tmp_path):
    for step in (10, 2, 30, 4):
        _fake_tag(tmp_path, f"global_step{step}", ("zero_pp_rank_0_mp_rank_00_optim_states.pt",))
    (tmp_path / "latest").write_text("global_step30")
    (tmp_path / "export").mkdir()  # not a tag: left alone
    removed = prune_old_tags(str(tmp_path), 2)
    assert sorted(removed) == ["global_step2", "global_step4"]  # by step number, not by name
    assert sorted(os.listdir(tmp_path)) == ["export", "global_step10", "global_step30", "latest"]
    assert prune_old_tags(str(tmp_path), 2) == []


def test_prune_never_deletes_the_latest_tag(tmp_path):
    for step in (1, 2, 3):
        _fake_tag(tmp_path, f"global_step{step}")
    (tmp_path / "latest").write_text("global_step1")  # e.g. a rollback
    assert prune_old_tags(str(tmp_path), 1) == ["global_step2"]


def test_prune_megatron_iterations(tmp_path):
    for it in (100, 200, 300):
        _fake_tag(tmp_path, f"iter_{it:07d}", (".metadata", "common.pt"))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("300")
    assert prune_old_tags(str(tmp_path), 1) == ["iter_0000100", "iter_0000200"]


def test_prune_rejects_keep_last_zero(tmp_path):
    with pytest.raises(InputError):
        prune_old_tags(str(tmp_path), 0)
