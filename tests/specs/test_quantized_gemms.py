"""The vocabulary tables stay 16-bit under FP8 (Megatron's VocabParallelEmbedding and ColumnParallelLinear output
layer are no Transformer Engine modules), except the output layer under fp8_output_proj (a TE linear)."""

import dataclasses

from autotune.specs.model_parts import ParamGroups
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.specs.quantized_gemms import quantized_gemm_groups, sixteen_bit_vocab_tables

LLAMA = load_model_preset("llama3-8b")  # untied
TIED = dataclasses.replace(LLAMA, tied_embeddings=True)


def _plan(pp=1, **kw):
    return ParallelPlan(engine="megatron", pp=pp, dp=1, micro_batch_size=1, global_batch_size=8,
                        grad_accum_steps=8, seq_len=4096, precision="fp8", **kw)


def test_tables_per_stage():
    assert sixteen_bit_vocab_tables(LLAMA, _plan(), 0) == 2  # embedding and output layer on the one stage
    assert sixteen_bit_vocab_tables(TIED, _plan(), 0) == 1  # one shared table
    four = _plan(pp=4)
    assert [sixteen_bit_vocab_tables(LLAMA, four, s) for s in range(4)] == [1, 0, 0, 1]
    assert [sixteen_bit_vocab_tables(TIED, four, s) for s in range(4)] == [1, 0, 0, 1]  # the last stage's copy
    assert [sixteen_bit_vocab_tables(LLAMA, _plan(pp=4, mtp_layers=1), s) for s in range(4)] == [1, 0, 0, 2]


def test_the_fp8_output_layer_is_quantized():
    head = _plan(pp=4, fp8_output_proj=True, fp8_recipe="te-mxfp8")
    assert [sixteen_bit_vocab_tables(LLAMA, head, s) for s in range(4)] == [1, 0, 0, 0]
    assert sixteen_bit_vocab_tables(LLAMA, _plan(fp8_output_proj=True, fp8_recipe="te-mxfp8"), 0) == 1


def test_groups_lose_their_tables_only():
    table = LLAMA.vocab_size * LLAMA.hidden_size
    groups = ParamGroups(tp_sharded=10 * table, replicated=7, expert=5)
    assert quantized_gemm_groups(LLAMA, _plan(), 0, groups) == ParamGroups(tp_sharded=8 * table, replicated=7,
                                                                           expert=5)
    assert quantized_gemm_groups(LLAMA, _plan(pp=4), 1, groups) == groups
