"""What torchtitan's Qwen3 and GPT-OSS packages (and its MoE meshes) refuse, or run otherwise than the plan says.

Each rule cites the torchtitan source it reads: v0.2.2 as pip installs it (paths under ``torchtitan/``), 0.3.0
as released. Rules of every model (world size, fp16, ZeRO-1, ...) stay in ``torchtitan_plan_problems``; these
are the ones that depend on the model package (``qwen3``, ``gpt_oss``) or on MoE expert parallelism.
"""

from __future__ import annotations

from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["NO_PIPELINING_02", "model_problems_02", "model_problems_03", "expert_problems_02"]

# v0.2.2 TrainSpecs without a pipelining function: train.py:218-223 raises "Pipeline Parallel is enabled but
# {name} does not support pipelining" for them. 0.3.0 gives both ``pipelining_fn=pipeline_llm``
# (models/qwen3/__init__.py:632, models/gpt_oss/__init__.py:407).
NO_PIPELINING_02 = {"qwen3": "models/qwen3/__init__.py:199", "gpt_oss": "models/gpt_oss/__init__.py:85"}


def model_problems_02(name: str | None, plan: ParallelPlan, *, compiles: bool, has_03: bool) -> list[str]:
    """torchtitan v0.2.2's refusals for the model package ``name`` (``compiles``: the file turns compile on;
    ``has_03``: autotune writes a 0.3 module for this preset, so 0.3 is a fix to name)."""
    out = []
    later = ", or emit with --engine-version fsdp=0.3" if has_03 else ""
    if name in NO_PIPELINING_02 and plan.pp > 1:
        out.append(f"pp {plan.pp}: torchtitan 0.2.2's {name} TrainSpec has pipelining_fn=None "
                   f"({NO_PIPELINING_02[name]}) and train.py:218-223 raises \"Pipeline Parallel is enabled but "
                   f"{name} does not support pipelining\": use --pp 1 (shard with FSDP / ep / tp instead){later}")
    if name != "gpt_oss":
        return out
    if plan.cp > 1:
        out.append(f"cp {plan.cp}: torchtitan 0.2.2's GptOssModelArgs.update_from_config raises \"CP support for "
                   "gpt-oss model is still in progress.\" (models/gpt_oss/model/args.py:89-92): use --cp 1")
    if plan.tp > 1 and plan.tp_overlap == "async-tp":
        out.append("async TP: torchtitan 0.2.2's parallelize_gptoss applies TP with enable_async_tp=False whatever "
                   "the config says (models/gpt_oss/infra/parallelize.py:95-101): drop --tp-overlap async-tp")
    if compiles:
        out.append("torch.compile: torchtitan 0.2.2's parallelize_gptoss never compiles the model (no apply_compile "
                   "in models/gpt_oss/infra/parallelize.py:61-172; compile.enable reaches only AC and DDP), so it "
                   "would run eager where this plan was estimated compiled (fp8 turns compile on): use bf16 without "
                   f"--compile{later}")
    return out


def expert_problems_02(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """torchtitan v0.2.2's ParallelDims rules for the expert mesh (experts split ep x etp; FSDP over the rest)."""
    if not model.is_moe or plan.ep == 1:
        return []
    out = []
    etp = plan.expert_tp
    if etp not in (1, plan.tp):
        out.append(f"etp {etp}: torchtitan 0.2.2 asserts \"Currently we only support ETP=TP or ETP=1\" "
                   "(distributed/parallel_dims.py:58-59): leave etp unset (= tp)")
    replicate = plan.dp if plan.zero_stage == 0 else plan.dp_replicate
    dense = plan.dp // replicate * plan.cp * plan.tp
    if dense % (plan.ep * etp):
        out.append(f"torchtitan 0.2.2 cuts dp_shard x cp x tp = {dense} ranks into efsdp x ep x etp "
                   f"(distributed/parallel_dims.py:136-157): ep {plan.ep} x etp {etp} does not divide it; "
                   "choose an ep that divides dp_shard x cp")
    return out


def model_problems_03(package: str, model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """torchtitan 0.3.0's refusals for the model package, and its expert layout against the plan's."""
    out = []
    if package == "gpt_oss" and plan.cp > 1:
        out.append(f"cp {plan.cp}: torchtitan 0.3's gpt_oss recipes build varlen attention (model_registry "
                   "attn_backend=\"varlen\", models/gpt_oss/__init__.py:391) and context parallelism raises "
                   "\"Variable-length attention CP is not yet supported\" (distributed/context_parallel/api.py:"
                   "103-104): use --cp 1")
    if model.is_moe and plan.ep > 1 and plan.tp > 1 and plan.expert_tp != 1:
        # The FSDP engine's estimate splits every expert tp ways inside its EP rank (etp = tp, as torchtitan 0.2's
        # expert_tensor_parallel_degree = tp); 0.3 has no such degree.
        out.append(f"tp {plan.tp} with ep {plan.ep}: torchtitan 0.3 has no expert tensor parallelism: with ep > 1 "
                   "the expert weights are sharded over ep only (models/common/moe_sharding.py:29-47, 201-209) and EP "
                   "borrows ranks from dp_shard x cp x tp (config/configs.py:279-287), not the tp x ep split this "
                   "plan was estimated with: use --tp 1 with ep, --ep 1 with tp, or emit with "
                   "--engine-version fsdp=0.2 (expert_tensor_parallel_degree = tp)")
    return out
