"""Capacity questions over the planner: the fewest GPUs that train a model, the largest model a
cluster trains, and what a failed request would need instead.

Both searches assume monotonicity (more GPUs never make a model stop fitting; a larger model
never starts fitting), which holds for the memory ledger since ZeRO/TP/PP shard states further
as GPUs are added; each answer is then confirmed by a full search at that size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.engines import engine_for
from autotune.report import plan_summary
from autotune.rules import plan_problems
from autotune.search.planner import SearchResult, search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["MinGpusAnswer", "min_gpus", "MaxModelAnswer", "max_model", "llama_shaped", "infeasibility_hint",
           "MODEL_REFUSALS", "model_refusal"]

MODEL_REFUSALS = ("architecture", "layer_norms", "moe_form")
"""Engine rule dimensions that refuse the model itself, whatever the plan (autotune/engines: layers or experts an
engine's files cannot build): no number of GPUs helps."""


def _cluster_with(cluster: ClusterSpec, num_gpus: int) -> ClusterSpec:
    per_node = min(cluster.gpus_per_node, num_gpus)
    return replace(cluster, num_nodes=max(1, num_gpus // per_node), gpus_per_node=per_node)


def _gpu_counts(gpus_per_node: int, max_gpus: int) -> list[int]:
    """1, 2, 4, ... up to a node, then whole nodes."""
    counts, v = [], 1
    while v < gpus_per_node:
        counts.append(v)
        v *= 2
    counts += list(range(gpus_per_node, max_gpus + 1, gpus_per_node))
    return counts


def _feasible(model: ModelSpec, cluster: ClusterSpec, seq_len: int, global_batch: int | None,
              constraints: SearchConstraints) -> SearchResult:
    # No global batch given: one micro-batch per replica is always divisible; use the GPU count as the batch.
    gb = global_batch or cluster.num_gpus
    return search_plans(model, cluster, seq_len=seq_len, global_batch_size=gb, constraints=constraints, top_k=1)


def _smallest(model, cluster, seq_len, global_batch, constraints, max_gpus,
              progress=None) -> tuple[int | None, SearchResult | None]:
    """The fewest GPU counts' first feasible one, searched from below: counts at indices 0, 1, 3, 7, ... until
    one is feasible (the last count if none before it is), then a binary search between it and the infeasible
    count before. Small clusters are quick to search, so the answer costs about what a search at twice its size
    does, not a search at ``max_gpus`` (65,536 GPUs: minutes)."""
    counts = _gpu_counts(cluster.gpus_per_node, max_gpus)

    def search(i: int) -> SearchResult:
        result = _feasible(model, _cluster_with(cluster, counts[i]), seq_len, global_batch, constraints)
        if progress is not None:
            progress(f"{counts[i]} GPUs: {'feasible' if result.num_feasible else 'infeasible'}")
        return result

    lo, i = -1, 0  # counts[lo] is infeasible (-1: none tried yet)
    while True:
        result = search(i)
        if result.num_feasible:
            break
        if i == len(counts) - 1:
            return None, None
        lo, i = i, min(2 * i + 1, len(counts) - 1)
    hi, best = i, (counts[i], result)
    while hi - lo > 1:  # counts[lo] infeasible, counts[hi] feasible
        mid = (lo + hi) // 2
        result = search(mid)
        if result.num_feasible:
            hi, best = mid, (counts[mid], result)
        else:
            lo = mid
    return best


@dataclass(frozen=True, slots=True, kw_only=True)
class MinGpusAnswer:
    with_offload: int | None
    without_offload: int | None
    best_with_offload: SearchResult | None
    best_without_offload: SearchResult | None


def min_gpus(model: ModelSpec, cluster: ClusterSpec, *, seq_len: int, global_batch: int | None = None,
             constraints: SearchConstraints | None = None, max_gpus: int = 65536, progress=None) -> MinGpusAnswer:
    """Fewest GPUs of this kind that train ``model``, with and without offload.

    ``progress``, if given, is called with one line after each plan search (the CLI prints it on stderr).
    """
    c = constraints or SearchConstraints()
    say = None if progress is None else (lambda what: lambda line: progress(f"{what}: {line}"))
    n_off, r_off = _smallest(model, cluster, seq_len, global_batch, replace(c, allow_offload=True), max_gpus,
                             None if say is None else say("with offload"))
    n_plain, r_plain = _smallest(model, cluster, seq_len, global_batch, replace(c, allow_offload=False), max_gpus,
                                 None if say is None else say("without offload"))
    return MinGpusAnswer(with_offload=n_off, without_offload=n_plain, best_with_offload=r_off,
                         best_without_offload=r_plain)


def model_refusal(model: ModelSpec, cluster: ClusterSpec, constraints: SearchConstraints | None = None, *,
                  seq_len: int) -> str | None:
    """Why no engine of ``constraints.engines`` can build ``model`` at all (its rules of :data:`MODEL_REFUSALS`, asked
    of a one-GPU plan of each at the request's ``seq_len``: a window shorter than the sequence is one such refusal),
    with the way out; None where at least one can."""
    c = constraints or SearchConstraints()
    messages = []
    for name in c.engines:
        plan = ParallelPlan(engine=name, dp=1, global_batch_size=1, grad_accum_steps=1, seq_len=seq_len,
                            zero_stage=engine_for(name).default_zero_stage)
        refusals = [msg for rule, msg in plan_problems(model, cluster, plan)
                    if rule.partition(":")[2] in MODEL_REFUSALS]
        if not refusals:
            return None
        messages += refusals
    return (f"no engine searched can build {model.name}, on any number of GPUs ({'; '.join(messages)}): give "
            f"another --engine, or leave --engine out to search every engine")


def infeasibility_hint(model: ModelSpec, cluster: ClusterSpec, *, seq_len: int, global_batch: int | None,
                       constraints: SearchConstraints | None = None, answer: MinGpusAnswer | None = None) -> str:
    """What would make an infeasible request possible, e.g. 'needs at least 24 H100s with ZeRO-3 +
    CPU optimizer offload, or 48 without offload'. ``answer``: a min_gpus answer already computed."""
    refused = model_refusal(model, cluster, constraints, seq_len=seq_len)
    if refused:
        return refused
    ans = answer or min_gpus(model, cluster, seq_len=seq_len, global_batch=None, constraints=constraints)
    gpu = cluster.gpu.name
    if ans.with_offload is None and ans.without_offload is None:
        return f"{model.name} does not fit on any number of {gpu} GPUs up to 65536 at seq_len {seq_len}"
    parts = []
    if ans.with_offload is not None and (ans.without_offload is None or ans.with_offload < ans.without_offload):
        assert ans.best_with_offload is not None
        parts.append(f"at least {ans.with_offload} x {gpu} with offload "
                     f"({plan_summary(ans.best_with_offload.candidates[0].plan)})")
    if ans.without_offload is not None:
        parts.append(f"{'or ' if parts else 'at least '}{ans.without_offload} without offload")
    hint = f"{model.name} at seq_len {seq_len} needs " + ", ".join(parts)
    if global_batch:
        hint += " (with a global batch those GPU counts divide)"
    return hint


def llama_shaped(hidden_size: int) -> ModelSpec:
    """A Llama-3-shaped model of the given width: head dim 128, 8 KV heads, FFN ~3.5h (multiple of
    256), layers ~ h / 102 (Llama-3 8B: 4096/32 = 128, 70B: 8192/80 = 102, 405B: 16384/126 = 130)."""
    heads = hidden_size // 128
    layers = max(2, round(hidden_size / 110))
    ffn = int(round(3.5 * hidden_size / 256)) * 256
    return ModelSpec(name=f"llama-shaped-h{hidden_size}", num_layers=layers, hidden_size=hidden_size,
                     num_attention_heads=heads, num_kv_heads=min(8, heads), ffn_hidden_size=ffn, vocab_size=128256,
                     activation="swiglu", norm="rmsnorm", position_embedding="rope")


@dataclass(frozen=True, slots=True, kw_only=True)
class MaxModelAnswer:
    largest: ModelSpec | None
    best: SearchResult | None
    next_size: ModelSpec
    binding_limit: str
    """'memory': no plan of the next size fits; 'bandwidth': some fit, but communication or offload
    keeps their best MFU under the threshold."""
    next_best_mfu: float | None


def max_model(cluster: ClusterSpec, *, seq_len: int, global_batch: int | None = None,
              constraints: SearchConstraints | None = None, min_mfu: float = 0.2,
              max_hidden: int = 65536, progress=None) -> MaxModelAnswer:
    """Largest Llama-shaped model the cluster trains at >= ``min_mfu``, and which limit binds beyond it.

    ``progress``, if given, is called with one line after each plan search.
    """
    c = constraints or SearchConstraints()
    widths = list(range(1024, max_hidden + 1, 1024))

    searched: dict[int, tuple[bool, SearchResult]] = {}

    def trainable(h: int) -> tuple[bool, SearchResult]:
        if h in searched:  # the size after the largest is usually the binary search's last probe
            return searched[h]
        result = _feasible(llama_shaped(h), cluster, seq_len, global_batch, c)
        ok = bool(result.candidates) and result.candidates[0].time.mfu >= min_mfu
        if progress is not None:
            progress(f"hidden {h}: {'trains' if ok else 'does not train'} at MFU >= {min_mfu:.0%}")
        searched[h] = ok, result
        return ok, result

    lo, hi = 0, len(widths) - 1
    best: tuple[int, SearchResult] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        ok, result = trainable(widths[mid])
        if ok:
            best, lo = (widths[mid], result), mid + 1
        else:
            hi = mid - 1
    next_index = min(lo, len(widths) - 1)
    _, after = trainable(widths[next_index])
    limit = "memory" if not after.num_feasible else "bandwidth"
    next_mfu = after.candidates[0].time.mfu if after.candidates else None
    return MaxModelAnswer(largest=llama_shaped(best[0]) if best else None, best=best[1] if best else None,
                          next_size=llama_shaped(widths[next_index]), binding_limit=limit, next_best_mfu=next_mfu)
