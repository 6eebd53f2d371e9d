"""FSDP2 under pipelining: the first stage's embedding and the last stage's norm and output layer are no Float8
linears, so with torchao's FP8 all-gather they stay gathered in 16 bits beside the 1-byte blocks
(``autotune.engines.fsdp._root_params``)."""

from __future__ import annotations

import pytest

from autotune.engines import engine_for
from autotune.specs.layout import stage_param_groups
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.specs.settings import MemorySettings

MODEL = load_model_preset("llama3-8b")


def _plan(**kw) -> ParallelPlan:
    base = dict(engine="fsdp", tp=2, pp=4, dp=8, zero_stage=2, micro_batch_size=1, global_batch_size=64,
                grad_accum_steps=8, seq_len=8192, recompute="full", sequence_parallel=True, precision="fp8")
    return ParallelPlan(**(base | kw))


def _gathered(plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(the stage's gathered weights, its parameters per GPU)."""
    engine = engine_for(plan)
    groups = stage_param_groups(MODEL, plan, stage, engine.support.layer_split)
    parts = engine.buffers(MODEL, plan, groups, MemorySettings(), stage=stage)
    return parts["unsharded_params"], groups.per_gpu(plan.tp, plan.ep)


def test_fp8_gathered_stage_keeps_its_vocabulary_tables_in_16_bits():
    plan = _plan()
    table = MODEL.vocab_size * MODEL.hidden_size / plan.tp
    final_norm = MODEL.output_params().replicated
    first, first_params = _gathered(plan, 0)
    assert first == pytest.approx(first_params + table)  # 1 byte a block weight, 2 the embedding
    last, last_params = _gathered(plan, plan.pp - 1)
    assert last == pytest.approx(last_params + table + final_norm)
    middle, middle_params = _gathered(plan, 1)
    assert middle == pytest.approx(middle_params)


def test_bf16_and_full_shard_stages_are_unchanged():
    bf16 = _plan(precision="bf16")
    gathered, params = _gathered(bf16, 0)
    assert gathered == pytest.approx(2 * params)
    full = _plan(zero_stage=3)  # blocks reshard after forward; the largest block bounds the stage's tables
    assert _gathered(full, 0)[0] == pytest.approx(_gathered(full, 1)[0])


def test_the_ledger_counts_the_loaded_stage_tables_in_16_bits():
    from autotune.cost.memory import estimate_memory
    from autotune.specs.loading import load_cluster

    plan = _plan()
    mem = estimate_memory(MODEL, load_cluster(gpu="h100-sxm-80gb", num_gpus=64, gpus_per_node=8), plan)
    params = stage_param_groups(MODEL, plan, mem.stage, engine_for(plan).layer_split_of(plan, MODEL.num_layers)
                                ).per_gpu(plan.tp, 1)
    table = MODEL.vocab_size * MODEL.hidden_size / plan.tp
    tables = table * (mem.stage == 0) + (table + MODEL.output_params().replicated) * (mem.stage == plan.pp - 1)
    assert tables > 0
    assert mem.buffer_parts["unsharded_params"] == pytest.approx(params + tables)
