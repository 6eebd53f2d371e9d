"""The Megatron-LM flags that make Megatron-core build autotune's pipeline split (``specs.layout.virtual_layout``).

Megatron-core places transformer layers on the pp x vpp virtual stages in one of four ways; for each plan the first
whose placement equals ours is written:

1. even: ``--num-layers-per-virtual-pipeline-stage L / (pp x vpp)`` under interleaving (arguments.py:953-975);
2. (without interleaving first) ``--decoder-first/last-pipeline-num-layers``: the middle stages share the rest
   evenly, with interleaving each stage's layers over its chunks (transformer_block.py:103-146,
   transformer_config.py:2294-2360; with vpp it needs ``--num-virtual-stages-per-pipeline-rank``, arguments.py:955);
3. ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the embedding and the
   loss take a layer's slot on the first / last virtual stage (arguments.py:962-967, transformer_block.py:148-201);
4. otherwise ``--pipeline-model-parallel-layout``, the stages spelled out ("Et|tt|...|ttL"; E embedding, t a layer,
   L the loss, stages in model order: pipeline_parallel_layer_layout.py:48-54, 281-320). It replaces the vpp flags
   (arguments.py:929-952). A plan's multi-token-prediction modules are spelled too, one "m" each before the loss
   on the last stage: Megatron-core counts them against --mtp-num-layers and wants them all after the decoder
   layers, in one rank's last virtual stage (pipeline_parallel_layer_layout.py:111-137 at d98e8a6); the other
   three ways place them on the last stage themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autotune.specs.context_parallel import hierarchical_cp_sizes
from autotune.specs.layout import split_scheme, virtual_layout
from autotune.specs.plan import ParallelPlan

__all__ = ["MegatronSplit", "cp_comm_flags", "cp_comm_setting", "expanded_layout", "layout_counts", "loss_slots_of",
           "megatron_split", "read_loss_slots", "split_flags", "split_target"]


@dataclass(frozen=True)
class MegatronSplit:
    kind: str
    """"even", "first_last", "account" or "layout"."""
    first: int | None = None
    last: int | None = None
    account_embedding: bool = False
    account_loss: bool = False
    layers_per_virtual_stage: int | None = None
    virtual_stages: int | None = None
    """--num-virtual-stages-per-pipeline-rank (first/last with interleaving)."""
    layout: str | None = None


def _chunks(per_stage: list[int], pp: int, vpp: int) -> tuple[int, ...] | None:
    out = [0] * (pp * vpp)
    for s, n in enumerate(per_stage):
        if n % vpp:
            return None
        for c in range(vpp):
            out[c * pp + s] = n // vpp
    return tuple(out)


def _first_last(num_layers: int, pp: int, vpp: int, target: tuple[int, ...]) -> MegatronSplit | None:
    per = [sum(target[c * pp + s] for c in range(vpp)) for s in range(pp)]
    first, last, middle = per[0], per[-1], per[1:-1]
    if pp < 2 or min(first, last) < 1 or len(set(middle)) > 1 or _chunks(per, pp, vpp) != target:
        return None
    return MegatronSplit("first_last", first=first, last=last, virtual_stages=vpp if vpp > 1 else None)


def _account(num_layers: int, pp: int, vpp: int, target: tuple[int, ...], emb: bool, loss: bool):
    slots = num_layers + emb + loss
    if slots % (pp * vpp):
        return None
    implied = [slots // (pp * vpp)] * (pp * vpp)
    implied[0] -= emb
    implied[-1] -= loss
    if tuple(implied) != target:
        return None
    return MegatronSplit("account", account_embedding=emb, account_loss=loss,
                         layers_per_virtual_stage=slots // (pp * vpp) if vpp > 1 else None)


def megatron_split(num_layers: int, pp: int, vpp: int, mtp_layers: int | None = None,
                   loss_slots: int | None = None) -> MegatronSplit | None:
    """The flags for autotune's split of ``num_layers`` over pp x vpp, or None when Megatron-core has none;
    ``mtp_layers``: the plan's multi-token-prediction modules, in a layout (module docstring, 4); ``loss_slots``:
    the plan's, the output layer and loss as that many layer slots (``layout.split_scheme``), in whichever of the
    four ways gives that split."""
    # the cost model's split (MTP modules counted on the last stage where the slot split places the layers)
    target = split_target(num_layers, pp, vpp, mtp_layers, loss_slots)
    if target is None:
        return None
    if pp == 1 or target == (num_layers // (pp * vpp),) * (pp * vpp):
        return MegatronSplit("even", layers_per_virtual_stage=num_layers // (pp * vpp) if vpp > 1 else None)
    if vpp == 1 and (found := _first_last(num_layers, pp, vpp, target)):
        return found
    for emb, loss in ((True, True), (False, True), (True, False)):
        if found := _account(num_layers, pp, vpp, target, emb, loss):
            return found
    if found := _first_last(num_layers, pp, vpp, target):
        return found
    stages = ["t" * n for n in target]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "m" * (mtp_layers or 0) + "L"
    return MegatronSplit("layout", layout="|".join(stages))


def split_target(num_layers: int, pp: int, vpp: int, mtp_layers: int | None = None,
                 loss_slots: int | None = None) -> tuple[int, ...] | None:
    """The layers of each virtual stage the cost model gives a Megatron plan (``layout.virtual_layout`` of its
    ``split_scheme``)."""
    return virtual_layout(num_layers, pp, vpp, split_scheme("megatron", mtp_layers, num_layers, pp, vpp, loss_slots))


def layout_counts(layout: str) -> tuple[int, ...]:
    """The transformer layers ("t") of each virtual stage of a --pipeline-model-parallel-layout string."""
    return tuple(stage.count("t") for stage in expanded_layout(layout).split("|"))


def loss_slots_of(target: tuple[int, ...], num_layers: int, pp: int, vpp: int,
                  mtp_layers: int | None = None) -> tuple[bool, int | None]:
    """(whether autotune models the split ``target`` Megatron-core builds from a job's files, the plan's
    ``loss_slots`` for it): None where it is the engine's own split (a K whose split is that one too reads back as
    None: the same plan, priced the same), else the smallest K that gives it."""
    if target == split_target(num_layers, pp, vpp, mtp_layers):
        return True, None
    for k in range(1, num_layers + 2):
        if split_target(num_layers, pp, vpp, mtp_layers, k) == target:
            return True, k
    return False, None


def rank_loads_loss_slots(layout: str, num_layers: int, pp: int, vpp: int,
                          mtp_layers: int | None = None) -> int | None:
    """The smallest ``loss_slots`` K whose split loads every pipeline rank as ``layout`` does (Megatron places
    virtual stage i on rank i mod pp; a rank's load is the layers of its chunks): the first and last ranks exactly,
    which hold the embedding and the output layer and loss, the others as a multiset. None where none does. For a
    layout autotune cannot write itself (NVIDIA's Llama-3 70B FP8 H100 recipe moves a layer from the last rank to
    rank 3, where K = 1 moves it to rank 1): its ranks' loads, which set the pipeline's pace, are then modelled."""
    counts = layout_counts(layout)
    if len(counts) != pp * vpp:
        return None
    want = [sum(counts[r::pp]) for r in range(pp)]
    for k in range(1, num_layers + 2):
        target = split_target(num_layers, pp, vpp, mtp_layers, k)
        if target is None or len(target) != pp * vpp:
            continue
        got = [sum(target[r::pp]) for r in range(pp)]
        if (got[0], got[-1]) == (want[0], want[-1]) and sorted(got) == sorted(want):
            return k
    return None


def read_loss_slots(num_layers: int, pp: int, vpp: int, mtp_layers: int | None = None, first: int | None = None,
                    last: int | None = None, layout: str | None = None) -> tuple[bool, int | None]:
    """:func:`loss_slots_of` the split a job's files state: a --pipeline-model-parallel-layout string, or the first /
    last stages' layer counts (--decoder-first/last-pipeline-num-layers, the middle stages sharing the rest evenly,
    each stage's layers over its chunks evenly); (True, None) where they state neither (the engine's own split, or
    the account-for flags, which give it: tests/test_loss_slots.py)."""
    if isinstance(layout, str):
        target: tuple[int, ...] | None = layout_counts(layout)
    elif first is not None and last is not None:
        rest, middle = num_layers - first - last, pp - 2
        if rest < 0 or (middle and rest % middle) or (not middle and rest):
            return False, None
        target = _chunks([first, *[rest // max(middle, 1)] * middle, last], pp, vpp)
    else:
        return True, None
    if target is None or len(target) != pp * vpp:
        return False, None
    return loss_slots_of(target, num_layers, pp, vpp, mtp_layers)


def expanded_layout(layout: str) -> str:
    """A --pipeline-model-parallel-layout string spelled out: "(...)*n" and "x*n" repeated, commas and spaces gone
    (megatron/core/transformer/pipeline_parallel_layer_layout.py:281-320 at d98e8a6)."""
    text = layout.replace(",", "").replace(" ", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    return re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)


def split_flags(split: MegatronSplit) -> list[str]:
    """Megatron-LM arguments of ``split``."""
    args: list[str] = []
    if split.first is not None:
        args += ["--decoder-first-pipeline-num-layers", str(split.first),
                 "--decoder-last-pipeline-num-layers", str(split.last)]
    if split.account_embedding:
        args.append("--account-for-embedding-in-pipeline-split")
    if split.account_loss:
        args.append("--account-for-loss-in-pipeline-split")
    if split.layers_per_virtual_stage is not None:
        args += ["--num-layers-per-virtual-pipeline-stage", str(split.layers_per_virtual_stage)]
    if split.virtual_stages is not None:
        args += ["--num-virtual-stages-per-pipeline-rank", str(split.virtual_stages)]
    if split.layout is not None:
        args += ["--pipeline-model-parallel-layout", split.layout]
    return args


def cp_comm_setting(plan: ParallelPlan, gpus_per_node: int) -> tuple[str, tuple[int, int] | None] | None:
    """(Megatron's cp_comm_type value, the hierarchical sizes for a2a+p2p) where the plan sets an exchange; None
    otherwise. Megatron passes the value to Transformer Engine as it is
    (megatron/core/extensions/transformer_engine.py:2153 at d98e8a6) and TE names the all-gather exchange
    ``all_gather`` (context_parallel.py:5110 at d0067d0: "allgather" would raise "Unsupported communication type");
    a2a+p2p needs its hierarchical sizes (arguments.py:583-585): autotune.specs.context_parallel's split."""
    kind = plan.cp_comm_type
    if kind is None:
        return None
    sizes = hierarchical_cp_sizes(plan.cp, plan.tp, gpus_per_node) if kind == "a2a+p2p" else None
    return ("all_gather" if kind == "allgather" else kind), sizes


def cp_comm_flags(plan: ParallelPlan, gpus_per_node: int) -> list[str]:
    """--cp-comm-type [--hierarchical-context-parallel-sizes A B] of :func:`cp_comm_setting`."""
    setting = cp_comm_setting(plan, gpus_per_node)
    if setting is None:
        return []
    value, sizes = setting
    return ["--cp-comm-type", value] + (["--hierarchical-context-parallel-sizes", *map(str, sizes)] if sizes else [])
