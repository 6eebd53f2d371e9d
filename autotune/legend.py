"""What the tables' notation means: the one place the plan notation, columns and rule ids are explained.

``report`` prints :func:`plan_legend` under each plan and estimate table and :func:`rejection_legend`
under the planner's "rejected:" line; the README's "Reading the output" section says the same
(a test keeps them in step). ``python -m autotune.legend`` prints every rule id and what it means. Each engine says what its own sharding tag means
(``Engine.sharding``), so new engines explain themselves.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable

from autotune.engines import engine_for
from autotune.specs.notation import TP_OVERLAP_WORDS, plan_notation
from autotune.specs.plan import FP8_RECIPES

__all__ = ["NOTATION", "COLUMNS", "REJECTIONS", "plan_legend", "rejection_legend", "rule_meaning", "wrap"]

WIDTH = 118
MAX_RULES_SHOWN = 8

# Tokens of a plan summary (autotune.specs.notation.plan_notation), in the order they appear.
NOTATION: dict[str, str] = {
    "tpN": "tensor parallel: each layer's matrices split over N GPUs",
    "ppN": "pipeline parallel: the layers split into N stages",
    "ppNxV": "N stages of V virtual stages each (interleaved 1F1B schedule)",
    "dpN": "data parallel: N replicas, each on its own micro-batches",
    "cpN": "context parallel: the sequence split over N GPUs",
    "epN": "expert parallel: the MoE experts split over N GPUs",
    "etpN": "expert tensor parallel: each expert's matrices split over N GPUs (Megatron parallel folding)",
    "sp": "sequence parallel: norms and dropout split along the sequence over the tp GPUs",
    "opt->cpu|nvme": "optimizer states offloaded to host memory or NVMe",
    "param->cpu|nvme": "parameters offloaded (ZeRO-3)",
    "mbMxA": "micro-batch of M sequences, A of them (accumulation steps) per optimizer step",
    "rc-selective|full": ("activation recompute: part of each layer (Megatron: the attention core, or "
                          "--recompute-modules; FSDP2: torchtitan's op-level SAC), or whole layers"),
    "rc:M+M": "what selective recompute reruns: Megatron's recompute modules (--recompute-modules)",
    "bf16|fp16|fp8": "training precision",
    "fp4": "NVFP4 training: the linear layers' GEMMs in 4-bit E2M1 blocks (Transformer Engine NVFP4BlockScaling, "
           "Megatron --fp4-format e2m1 --fp4-recipe nvfp4)",
    "grads-bf16": "gradients accumulated and reduced in bf16 (Megatron --grad-reduce-in-bf16)",
    "|".join(FP8_RECIPES): "FP8 scaling recipe (--fp8-recipe)",
    "tp-userbuffers|async-tp|tp-no-overlap": "TP collectives overlapped with the GEMMs by Megatron's userbuffers or "
                                             "torch async TP, or not (--tp-overlap)",
    "compiled|eager": "run under torch.compile, or not (--compile / --no-compile)",
    "loss-chunksN": "the output layer and loss computed in N chunks of the sequence (--loss-chunks)",
    "loss-slotsN": "the pipeline split counts the embedding as one layer slot and the output layer and loss as N, "
                   "the last stage holding fewer layers (--loss-slots; Megatron --pipeline-model-parallel-layout, "
                   "torchtitan pipeline_parallel_last_stage_less_layers)",
    "act-offloadN": "the saved activations of the first N layers offloaded to host memory in forward and reloaded "
                    "for backward (--activation-offload-layers: Megatron --cpu-offloading-num-layers)",
    "mtpN": "N multi-token-prediction modules trained after the last layer, each one more layer and the output layer "
            "with its own loss (--mtp-layers: Megatron --mtp-num-layers)",
    "cg-local|cg-te[:P+P]|cg-full|no-cuda-graphs": "CUDA graphs of each layer (or of its parts P) by Megatron or "
                                                   "Transformer Engine, one of the whole iteration (cg-full), or none "
                                                   "(--cuda-graph, --cuda-graph-scope)",
    "ep-overlap[+dw]|no-ep-overlap": "MoE all-to-alls behind another micro-batch's compute (Megatron "
                                     "--overlap-moe-expert-parallel-comm; +dw: --delay-wgrad-compute), or not "
                                     "(--ep-overlap)",
    "disp-alltoall|disp-allgather|disp-flex-deepep|disp-flex-hybridep": "the MoE token dispatcher (--moe-dispatcher: "
                                                                        "Megatron --moe-token-dispatcher-type, flex "
                                                                        "with --moe-flex-dispatcher-backend)",
    "cp-p2p|cp-a2a|cp-allgather|cp-a2a+p2p": "how context-parallel ranks exchange attention inputs (--cp-comm-type: "
                                             "Megatron --cp-comm-type)",
    "lora[-rR][:T+T]": "LoRA fine-tuning: base weights frozen, rank-R adapters on the layers T (--peft lora, "
                       "--lora-rank, --lora-targets; Megatron-Bridge peft=LoRA)",
}
# Columns of the plan table.
COLUMNS: dict[str, str] = {
    "mem GiB": "per-GPU memory of the most loaded pipeline stage",
    "step s": "predicted optimizer-step time = compute + comm + bubble + other",
    "compute": "GEMM and elementwise kernel time",
    "comm": "communication not hidden behind compute",
    "bubble": "pipeline fill and drain idle time",
    "other": "offload transfers + the optimizer step",
    "±": "the estimate's interval: the median leave-one-family-out error of the runs most like the plan "
         "(published runs and NVIDIA's Blackwell recipes, autotune.cost.uncertainty); '=' after the rank: tied "
         "with #1, each within the other's interval",
    "MFU": "model FLOPs per second / the GPUs' dense peak",
}
# Rejection reasons of `autotune plan` (rule ids of autotune/rules.py, the memory checks of the
# planner, and the engines' own rules, which are "<engine>:<dimension>").
REJECTIONS: dict[str, str] = {
    "world_size": "tp x pp x dp x cp differs from the GPU count",
    "heads_tp": "attention heads not a multiple of tp",
    "kv_heads_tp": "KV heads neither a multiple nor a divisor of tp",
    "layers_pp": "more pipeline stages than layers",
    "layers_vpp": "the layers do not fill the pp x vpp virtual stages (as the engine splits them)",
    "vpp_needs_pp": "virtual stages without a pipeline",
    "batch_triple": "global batch not a multiple of micro-batch x dp",
    "interleave_microbatches": "interleaved schedule: micro-batches not a multiple of pp",
    "seq_cp": "sequence length not a multiple of 2 x cp",
    "seq_sp": "sequence length not divisible by tp under sequence parallelism",
    "seq_positions": "sequence longer than the model's learned position table",
    "ep_dense": "expert parallelism on a dense model",
    "experts_ep": "experts not divisible by ep",
    "ep_dp": "etp x ep does not divide tp x dp x cp (etp defaults to tp: ep must divide dp x cp)",
    "ep_tp_sp": "Megatron: expert parallelism with tp needs sequence parallelism",
    "nvme_path": "NVMe offload without an NVMe folder",
    "nvme_cluster": "NVMe offload on a cluster without NVMe",
    "sp_tp": "sequence parallelism with tp 1",
    "precision_gpu": "the GPU has no tensor cores for this precision",
    "fp8_recipe_gpu": "this FP8 recipe needs another GPU generation (MXFP8: Blackwell; blockwise: Hopper or later)",
    "recompute_layers": "recompute layer count without full recompute, or above the layers per stage",
    "offload_param_zero3": "parameter offload needs ZeRO-3",
    "offload_optimizer_zero": "optimizer offload needs ZeRO 1-3",
    "gpu_memory": "does not fit in GPU memory",
    "host_memory": "offloaded states do not fit in host memory",
    "headroom": "fits, but with less than --min-headroom-gib to spare",
    "recompute_unneeded": "a recompute-module set the engine searches, at a micro-batch that fits without recompute "
                          "or with a narrower set",
}
# Engine rule "<engine>:<dimension>": the engine cannot run that dimension of the plan.
ENGINE_DIMENSIONS: dict[str, str] = {
    "tp": "no tensor parallelism", "sequence_parallel": "no sequence parallelism", "pp": "no pipeline parallelism",
    "tp_pp": "its tp does not compose with its pipeline", "vpp": "no interleaved schedule",
    "layer_split": "cannot split the layers over the stages", "cp": "no context parallelism",
    "ulysses_heads": "Ulysses needs heads divisible by cp", "ulysses_layout": "Ulysses layout not supported",
    "ep": "no expert parallelism", "etp": "no expert tensor parallelism of its own", "zero_stage": "no equivalent of this ZeRO stage",
    "zero_pp": "this ZeRO stage does not run with a pipeline", "offload": "this offload is not supported",
    "hybrid_no_shard": "hybrid sharding needs sharding", "hybrid_shard": "no hybrid sharding", "precision": "this precision is not supported",
    "offload_optimizer": "no optimizer offload", "offload_param": "no parameter offload",
    "pp_microbatches": "fewer micro-batches than pipeline stages",
    "release": "the release of its package modelled (--engine-version) cannot run it (torchtitan, the only program "
               "of expert-parallel fsdp plans: 0.2 has no pipelining for Qwen3 / GPT-OSS, 0.3 no expert TP)",
    "ep_model": "expert parallelism only in torchtitan's own MoE models (DeepSeek-V3, Qwen3, GPT-OSS)",
    "ep_mesh": "torchtitan's expert mesh: ep x etp must divide the sharded data-parallel x cp x tp ranks",
    "architecture": "its model code cannot build this architecture (ALiBi, an embedding norm, other than two "
                    "pre-norms per layer; Megatron-DeepSpeed: windows, sinks, Q/K norms, RoPE scaling, a router "
                    "other than a softmax)",
    "layer_norms": "its layer is two pre-norms: other norm layouts (parallel blocks, Gemma's sandwich) are not built",
    "moe_form": "DeepSpeed-MoE has no form for this MoE (experts narrower than the FFN, shared experts, dense "
                "first layers)",
    "moe_zero3": "DeepSpeed-MoE does not run under ZeRO-3",
    "moe_tp": "AutoTP leaves the experts whole on every TP rank (transformers 5's experts are 3-D parameters)",
    "grad_dtype": "this gradient dtype is not modelled (or not with this precision)",
    "fp8_recipe": "this FP8 recipe is not one the engine runs",
    "tp_overlap": "this TP communication overlap is not one the engine runs (or not with this layout)",
    "torch_compile": "its files cannot turn torch.compile on",
    "loss_chunks": "its files cannot chunk the loss",
    "activation_offload_layers": "its files cannot offload activations to host memory (Megatron only)",
    "activation_offload": "Megatron-core refuses activation CPU offload with pipeline parallelism, recompute, "
                          "per-layer CUDA graphs or N >= the layers",
    "mtp_layers": "its files cannot train multi-token-prediction modules (Megatron only)",
    "mtp": "Megatron-LM refuses multi-token prediction with this model's position embeddings (rope or none only)",
    "cuda_graph": "these CUDA graphs are not ones the engine runs (or not with this model or recompute)",
    "ep_overlap": "the engine cannot overlap the expert-parallel all-to-alls (or not with this layout or recompute)",
    "expert_bias": "biased experts split by expert tensor parallelism (Megatron-core needs etp 1 for them)",
    "moe_dispatcher": "the engine has no such MoE token dispatcher (or not for this model or layout)",
    "fp8_attention": "the engine cannot run attention in FP8 (Megatron only; not with this FP8 recipe)",
    "fp8_output_proj": "the engine cannot run the output layer in MXFP8 (Megatron-core 0.18+ only)",
    "loss_slots": "the engine cannot give the output layer and loss these layer slots (Megatron and fsdp / "
                  "torchtitan only; pp > 1; no virtual stage emptied, or one torchtitan's split refuses)",
    "moe_capacity_factor": "the engine cannot drop tokens over an expert capacity (or not so for this model)",
    "full_iteration_moe": "its whole-iteration CUDA graph cannot capture MoE layers whose dispatcher syncs on the host",
    "cp_comm_type": "the engine has no such context-parallel exchange (or not for this model or layout)",
    "recompute_modules": "these recompute modules are not ones the engine runs (or not in this model)",
    "peft": "the engine cannot run this parameter-efficient fine-tuning (or not for this model)",
    "fsdp": "Megatron-FSDP cannot run this plan (its optimizer, overlap or CUDA-graph limits)",
    "interleaved_rounds": "interleaved schedule: micro-batches not a multiple of its rounds",
}


def rule_meaning(rule: str) -> str:
    """One line for a rejection rule id; engine rules "<engine>:<dimension>" are explained by their parts."""
    if rule in REJECTIONS:
        return REJECTIONS[rule]
    engine, sep, dim = rule.partition(":")
    if sep:
        return f"{engine} cannot run it: {ENGINE_DIMENSIONS.get(dim, dim.replace('_', ' '))}"
    return rule.replace("_", " ")


def _tokens(summaries: Iterable[str]) -> set[str]:
    found = set()
    for summary in summaries:
        for word in summary.split():
            shape = re.sub(r"\d+", "N", word)
            if shape == "ppNxN":
                found.add("ppNxV")
            elif shape == "mbNxN":
                found.add("mbMxA")
            elif word.startswith(("opt->", "param->", "rc-")):
                found.add({"opt": "opt->cpu|nvme", "par": "param->cpu|nvme", "rc-": "rc-selective|full"}[word[:3]])
            elif word in ("bf16", "fp16", "fp8"):
                found.add("bf16|fp16|fp8")
            elif word == "fp4":
                found.add("fp4")
            elif word in FP8_RECIPES:
                found.add("|".join(FP8_RECIPES))
            elif word in TP_OVERLAP_WORDS.values():
                found.add("tp-userbuffers|async-tp|tp-no-overlap")
            elif word in ("compiled", "eager"):
                found.add("compiled|eager")
            elif word.startswith("lora"):
                found.add("lora[-rR][:T+T]")
            else:
                found.add(shape)
    return found


def plan_legend(plans) -> str:
    """'legend: ...' lines for the notation the given plans' summaries use, engine tags included."""
    plans = list(plans)
    used = _tokens(plan_notation(p, engine_for(p).tag(p)) for p in plans)
    parts = [f"{token} = {text}" for token, text in NOTATION.items() if token in used]
    tags = {}
    for plan in plans:
        engine = engine_for(plan)
        tags.setdefault(engine.tag(plan), f"{getattr(engine, 'title', engine.name)}: {engine.sharding(plan)}")
    parts += [f"{tag} = {text}" for tag, text in tags.items()]
    return wrap("legend: " + "; ".join(parts))


def rejection_legend(rules: Iterable[str]) -> str:
    """'rules: id = meaning; ...' for the first MAX_RULES_SHOWN rejection rule ids (most frequent first)."""
    rules = list(rules)
    text = "; ".join(f"{rule} = {rule_meaning(rule)}" for rule in rules[:MAX_RULES_SHOWN])
    if len(rules) > MAX_RULES_SHOWN:
        text += f"; {len(rules) - MAX_RULES_SHOWN} more rules: `python -m autotune.legend` explains every rule"
    return wrap("rules: " + text)


def wrap(text: str) -> str:
    """A legend paragraph wrapped to the tables' width, continuation lines indented."""
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False))


def all_rules_text() -> str:
    """Every rejection rule id with its meaning, one per line (what ``python -m autotune.legend`` prints)."""
    lines = ["Rules that reject a plan (autotune/rules.py, the planner's memory checks, the engines' own rules):", ""]
    width = max(map(len, REJECTIONS))
    lines += [f"  {rule:<{width}}  {meaning}" for rule, meaning in REJECTIONS.items()]
    lines += ["", "Engine rules are <engine>:<dimension>: that engine cannot run that part of the plan:", ""]
    width = max(map(len, ENGINE_DIMENSIONS))
    lines += [f"  {dim:<{width}}  {meaning}" for dim, meaning in ENGINE_DIMENSIONS.items()]
    lines += ["", "The engines' own words and sources for each: docs/engines.md (python -m autotune.engines.matrix)."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(all_rules_text())
