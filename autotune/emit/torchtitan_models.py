"""What torchtitan's Qwen3, GPT-OSS and Llama 4 packages (and its MoE meshes) refuse, or run otherwise than the plan says.

Each rule cites the torchtitan source it reads: v0.2.2 as pip installs it (paths under ``torchtitan/``), 0.3.0
as released. Rules of every model (world size, fp16, ZeRO-1, ...) stay in ``torchtitan_plan_problems``; these
are the ones that depend on the model package (``qwen3``, ``gpt_oss``, ``llama4``) or on MoE expert parallelism.
"""

from __future__ import annotations

import math

from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["NO_PIPELINING_02", "PARALLEL_DIMS_02", "model_problems_02", "model_problems_03", "expert_problems_02",
           "expert_mesh_problems_02", "experts_without_tp_03"]

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
    if name == "llama4" and plan.cp > 1:
        out.append(f"cp {plan.cp}: torchtitan 0.2.2's Llama 4 flavors attend with flex attention, and its "
                   "TransformerModelArgs.update_from_config raises \"Context Parallel only supports SDPA attention\" "
                   "(models/llama4/model/args.py:79-87): use --cp 1")
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


# torchtitan v0.2.2's ParallelDims (distributed/parallel_dims.py): _validate asserts ETP = TP or 1 when ep > 1
# (:58-59); build_mesh cuts dp_shard x cp x tp into efsdp x ep x etp, efsdp = dp_shard x cp x tp // (etp x ep)
# (:136-138), and unflattens the world into (pp, dp_replicate, efsdp, ep, etp) (:154-158), which raises unless ep x etp
# divides dp_shard x cp x tp: with etp = tp, ep divides dp_shard x cp; with etp = 1, ep divides dp_shard x cp x tp.
PARALLEL_DIMS_02 = "distributed/parallel_dims.py"


def expert_mesh_problems_02(dp_shard: int | None, cp: int, tp: int, ep: int, etp: int, *,
                            names: tuple[str, str] = ("ep", "etp"), etp_one: bool = True) -> list[tuple[str, str, str]]:
    """torchtitan v0.2.2's ParallelDims rules for the expert mesh, as (the degree at fault, "ep" or "etp"; the rule
    broken, with its source line; the way out). ``names``: how the caller's user writes ep and etp (flags or TOML
    keys); ``etp_one``: whether etp = 1 (EP takes the tp ranks too) is a way out (not for a plan whose experts split
    tp x ep); ``dp_shard`` None: not known yet (-1 without a world size), the ETP rule alone. One source for the
    TOML writer, its linter and its reader."""
    ep_name, etp_name = names
    dense = (dp_shard or 1) * cp * tp
    if ep > 1 and etp not in (1, tp):
        ways = [e for e in ((tp, 1) if etp_one else (tp,)) if dp_shard is None or dense % (e * ep) == 0] or [tp]
        return [("etp", f"etp {etp} with ep {ep} and tp {tp}: torchtitan 0.2.2 asserts \"Currently we only support "
                 f"ETP=TP or ETP=1\" ({PARALLEL_DIMS_02}:58-59)",
                 f"set {etp_name} to " + " or ".join(f"{e}" + (" (= tp)" if e == tp else "") for e in ways))]
    if dp_shard is None or dense % (ep * etp) == 0:
        return []
    message = (f"ep {ep} x etp {etp} = {ep * etp} does not divide dp_shard x cp x tp = {dense}: torchtitan 0.2.2 "
               f"cuts those ranks into efsdp x ep x etp (efsdp = {dense} // {ep * etp}, {PARALLEL_DIMS_02}:136-138) "
               f"and unflattening the world mesh into them raises ({PARALLEL_DIMS_02}:154-158)")
    if dense % etp:  # ep 1 (ParallelDims asserts nothing of etp then), yet the expert mesh is built all the same
        return [("etp", message, f"set {etp_name} to {tp} (= tp)" + (" or 1" if etp_one and tp > 1 else ""))]
    room = dense // etp  # the ranks EP may take: dp_shard x cp (etp = tp), x tp as well (etp = 1)
    fits = _divisors(room)
    near = [max((d for d in fits if d < ep), default=0), min((d for d in fits if d > ep), default=0)]
    fix = (f"set {ep_name} to " + " or ".join(str(d) for d in near if d) + " (" * any(near) + "a divisor of dp_shard x "
           f"cp{' x tp' if etp == 1 and tp > 1 else ''} = {room}" + ")" * any(near))
    if etp_one and etp != 1 and dense % ep == 0:
        fix += f", or {etp_name} to 1 (EP takes the tp ranks too)"
    return [("ep", message, fix)]


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` (none past 10^12, where a hostile file's degrees would take long to factor)."""
    if n > 10**12:
        return []
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def expert_problems_02(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """The expert-mesh rules (:func:`expert_mesh_problems_02`) for a plan, whose experts split ep x etp (etp = tp
    unless the plan says; FSDP over the rest)."""
    if not model.is_moe or plan.ep == 1:
        return []
    replicate = plan.dp if plan.zero_stage == 0 else plan.dp_replicate
    return [f"{message}: {fix}" for _, message, fix in expert_mesh_problems_02(
        plan.dp // replicate, plan.cp, plan.tp, plan.ep, plan.expert_tp, names=("--ep", "--etp"), etp_one=False)]


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
        out.append(experts_without_tp_03(plan.tp, plan.ep, "plan was estimated with") +
                   ": use --tp 1 with ep, --ep 1 with tp, or emit with --engine-version fsdp=0.2 "
                   "(expert_tensor_parallel_degree = tp)")
    return out


def experts_without_tp_03(tp: int, ep: int, whose: str) -> str:
    """Why torchtitan 0.3 runs tp > 1 with ep > 1 other than the FSDP engine models it (``whose``: "plan was
    estimated with" / "engine models")."""
    return (f"tp {tp} with ep {ep}: torchtitan 0.3 has no expert tensor parallelism: with ep > 1 the expert weights "
            "are sharded over ep only (models/common/moe_sharding.py:29-47, 201-209) and EP borrows ranks from "
            f"dp_shard x cp x tp (config/configs.py:279-287), not the tp x ep split this {whose}")
