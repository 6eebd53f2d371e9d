"""LoRA under Megatron-FSDP (autotune/engines/megatron_fsdp.py's docstring: frozen buckets keep their model-weight
buffer alone, sharded with optim_grads_params): what the ledger holds and what the step gathers, against full
training's Megatron-FSDP plan and the distributed optimizer's LoRA plan. Bridge 0.6.2's own validate() takes the
files (tests/emit/bridge_cases.py, case 70b-lora-mfsdp)."""

from __future__ import annotations

import pytest

from autotune.api import estimate, make_plan
from autotune.engines import engine_for
from autotune.engines.megatron_fsdp import MEGATRON_FSDP_GRAD_BYTES, UNIT_BUFFERS
from autotune.specs.lora import adapter_params_per_layer, trainable_stage_params
from autotune.specs.loading import load_cluster
from autotune.specs.plan import OPTIMIZER_STATE_BYTES
from autotune.specs.presets import load_model_preset

MODEL = load_model_preset("llama3-70b")
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
LORA = dict(peft="lora", lora_rank=16, lora_alpha=32, lora_targets=("linear_qkv",))


def _est(zero_stage: int, lora: bool = True):
    plan = make_plan(MODEL, CLUSTER, engine="megatron", zero_stage=zero_stage, global_batch_size=32, seq_len=4096,
                     recompute="selective", **(LORA if lora else {}))
    return plan, estimate(MODEL, CLUSTER, plan)


def test_zero3_shards_the_frozen_weights_and_trains_only_the_adapters():
    plan, lora = _est(3)
    _, full = _est(3, lora=False)
    adapters = trainable_stage_params(MODEL, plan, engine_for(plan).support.layer_split)
    shard = adapters / plan.zero_partitions
    assert 0 < adapters < 1e-3 * MODEL.num_params
    # the base weights' shard as full training holds it, plus the adapters' 16-bit shard
    assert lora.memory.weights == pytest.approx(full.memory.weights + 2 * shard, rel=1e-9)
    assert lora.memory.gradients == pytest.approx(MEGATRON_FSDP_GRAD_BYTES * shard, rel=1e-9)
    assert lora.memory.optimizer_states == pytest.approx(OPTIMIZER_STATE_BYTES[plan.optimizer] * shard, rel=1e-9)
    # a unit's gradient buffer holds the adapters' gradients alone; its weight buffer the whole layer, as in full
    parts, whole = lora.memory.buffer_parts, full.memory.buffer_parts
    assert parts["fsdp_unsharded_grads"] == pytest.approx(
        UNIT_BUFFERS * MEGATRON_FSDP_GRAD_BYTES * adapter_params_per_layer(MODEL, plan))
    assert parts["fsdp_unsharded_params"] == pytest.approx(whole["fsdp_unsharded_params"])
    assert lora.memory.total < 0.5 * _est(1)[1].memory.total  # the distributed optimizer keeps every base weight


def test_zero2_keeps_the_frozen_weights_whole():
    _, z2 = _est(2)
    _, z1 = _est(1)
    assert z2.memory.weights == pytest.approx(z1.memory.weights, rel=1e-3)  # base whole; adapters a rounding error
    assert z2.memory.gradients < z1.memory.gradients  # Megatron-FSDP shards the adapters' gradients


def test_zero3_gathers_the_frozen_weights_every_layer():
    _, lora = _est(3)
    _, full = _est(3, lora=False)
    # forward and backward gathers of the whole layer remain; only the gradients' reduce-scatter shrinks to the
    # adapters': at least half of full training's per-block traffic
    assert lora.time.comm_parts_s["zero3"] >= 0.5 * full.time.comm_parts_s["zero3"] > 0
