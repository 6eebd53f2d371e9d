"""Which of a pipeline stage's parameters Transformer Engine quantizes: every tensor-parallel GEMM weight of its
layers, not the vocabulary tables.

Megatron-core builds the token embedding as ``VocabParallelEmbedding`` and the output layer as
``tensor_parallel.ColumnParallelLinear`` (megatron/core/models/gpt/gpt_model.py:273-277 at d98e8a6), plain torch
modules: ``--fp8-param-gather``'s ``fp8_model_init`` gives only Transformer Engine modules FP8 weights, and only
TE modules keep FP8 weight copies, so both tables stay 16-bit. The one exception is ``fp8_output_proj``
(``ParallelPlan.fp8_output_proj``): the output layer is then ``TELMHeadColumnParallelLinear``, a TE linear run under
MXFP8 (gpt_model.py:273-276), quantized like the layers. torchtitan's Float8 leaves them out too (its converter
filters the module "output"; an embedding is no ``nn.Linear``).
"""

from __future__ import annotations

from autotune.specs.model import ModelSpec
from autotune.specs.model_parts import ParamGroups
from autotune.specs.plan import ParallelPlan

__all__ = ["sixteen_bit_vocab_tables", "quantized_gemm_groups"]


def sixteen_bit_vocab_tables(model: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    """Vocabulary tables (vocab x hidden each, tensor-parallel) of pipeline stage ``stage`` that stay 16-bit: the
    embedding on the first stage; on the last the output layer (untied, or a tied model's copy where pp > 1,
    ``ModelSpec.stage_params``) unless ``fp8_output_proj`` quantizes it, and the MTP modules' embedding where the
    last stage builds one (``autotune.specs.layout.stage_param_groups``)."""
    last = plan.pp - 1
    tables = int(stage == 0)
    if stage == last:
        own_head = not model.tied_embeddings or plan.pp > 1
        tables += int(own_head and not plan.fp8_output_proj)
        tables += int(bool(plan.mtp_layers) and stage > 0 and not model.tied_embeddings)
    return tables


def quantized_gemm_groups(model: ModelSpec, plan: ParallelPlan, stage: int, groups: ParamGroups) -> ParamGroups:
    """``groups`` (stage ``stage``'s parameters) less its 16-bit vocabulary tables: the weights TE quantizes."""
    table = model.vocab_size * model.hidden_size
    tables = sixteen_bit_vocab_tables(model, plan, stage)
    return ParamGroups(tp_sharded=max(0, groups.tp_sharded - tables * table), replicated=groups.replicated,
                       expert=groups.expert)
