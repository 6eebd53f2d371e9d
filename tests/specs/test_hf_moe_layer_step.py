"""Interleaved dense/MoE layers (moe_layer_step, Llama 4 Maverick) as the cost model and the Megatron
arguments see them: per stage, only the MoE layers count as MoE."""

from __future__ import annotations

import ast

from autotune.cost.stage_chunks import moe_layers_in
from autotune.cost.step_time import _stage_layer_counts
from autotune.emit.megatron_model_flags import moe_layer_pattern as _moe_layer_pattern
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


def test_maverick_stages_hold_half_moe_layers():
    model = load_model_preset("llama4-maverick")
    assert model.num_moe_layers == 24 and [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert moe_layers_in(model, 0, 48) == 24 and moe_layers_in(model, 1, 4) == 2
    plan = ParallelPlan(pp=4, dp=1, global_batch_size=1)
    counts = [_stage_layer_counts(model, plan, s, "megatron") for s in range(4)]
    assert counts == [(6, 6)] * 4
    pattern = ast.literal_eval(_moe_layer_pattern(model))
    assert pattern == [int(model.is_moe_layer(i)) for i in range(48)] and sum(pattern) == 24


def test_leading_dense_layers_unchanged():
    model = load_model_preset("deepseek-v3")
    assert moe_layers_in(model, 0, 61) == 58 and _moe_layer_pattern(model) == "([0]*3+[1]*58)"
    plan = ParallelPlan(pp=1, dp=1, global_batch_size=1)
    assert _stage_layer_counts(model, plan, 0, "megatron") == (3, 58)
