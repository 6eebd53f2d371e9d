"""Host launch overhead and CUDA graphs.

The host issues every kernel; it runs ahead of the GPU while a layer's GPU work takes longer than its launches, and
the GPU waits for it when it does not (small per-GPU work: small micro-batches, wide tensor or expert parallelism,
small experts). A layer pass then takes ``max(GPU time, kernels x launch time)``. A CUDA graph issues the kernels of
a captured part at once (one graph launch: ``cudaGraphLaunch``), so only the kernels outside the captured parts are
issued one by one (Megatron ``--cuda-graph-impl local|transformer_engine``, per layer, ``--cuda-graph-scope`` /
``--cuda-graph-modules`` the parts). The launch time per kernel is the engine's (``CommSchedule.kernel_launch_s``), an
x86 host's, times the GPU's ``KernelFacts.host_issue_factor`` (a Grace host issues each op 2.75x slower:
:func:`host_issue_s`).

Kernels per layer, forward, as Megatron-core's Transformer Engine layer spec runs them (megatron-core 0.19.2
``gpt_layer_specs.py``, ``transformer_layer.py``; fused kernels counted once): (GEMMs, other kernels) per part,
  attn: QKV and output projection GEMMs; input norm, RoPE, fused attention, bias-dropout-add.
  mlp (dense): fc1 and fc2 GEMMs; pre-MLP norm, activation, bias-dropout-add.
  moe_router: the router GEMM; pre-MLP norm, softmax and top-k, auxiliary loss (2).
  moe_preprocess (captured only when named, with moe_router: MoELayer.preprocess, the dispatcher's
    dispatch_preprocess): permute (2).
  moe_rest (never captured: token counts per expert change every step): dispatch all-to-alls (token
    counts, tokens), activation, combine all-to-all, unpermute (2), bias-dropout-add; per shared expert its two
    GEMMs and activation. The routed experts' grouped fc1 and fc2 are one cuBLASLt call (and under FP8 one
    quantize) per local expert, issued after the dispatcher's host sync: ``autotune.cost.expert_host`` counts
    them (with biased experts' per-expert bias kernels and a clamped GLU's kernels), and their host time adds to
    the layer's passes whole.
  FP8 adds a cast per GEMM input, NVFP4 two (its amax pass and its quantize kernel: TransformerEngine d0067d0
  csrc/quantizer.cpp NVFP4Quantizer::quantize_impl, ``nvte_hadamard_transform_amax`` then
  ``nvte_quantize_with_hadamard_transform``); tp > 1 two TP collectives per part with GEMMs. Backward runs two
  GEMMs (input and weight gradients) per forward GEMM and one kernel per other kernel.

Memory: Megatron's own graphs (``local``) keep, per captured part, static input and output buffers for its forward
and backward graphs (4 tensors of the layer's input size) per micro-batch in flight; what runs inside a graph
allocates from the graph's pool as it would from the caching allocator. Transformer Engine's graphs
(``transformer_engine``) are one graph per layer (megatron/core/transformer/cuda_graphs.py at d98e8a64: the
callables are the layers, :2258-2286) whose sample inputs are reused once a micro-batch's backward is done
(``_get_sample_arguments`` :2322-2380) and, from TE 2.7, whose input and output buffers are shared between
consecutive graphs (``_reuse_graph_input_output_buffers`` :2684-2686): a layer's static input is the previous
layer's static output, the activation the ledger already counts. What is left is one layer's forward output and
backward gradient pair beyond the chain, 4 tensors of the layer's input size per stage.

A full-iteration graph (``full-iteration``: Megatron's FullCudaGraphWrapper, megatron/core/full_cuda_graph.py at
core_v0.19.0) captures the forward-backward function of all micro-batches, wrapped at megatron/training/
training.py:3617-3622 there; the optimizer step is a separate call (its own graph only with --optimizer-cuda-graph,
:3633-3638), outside what is modelled here. Every kernel of the forward-backward, the routed experts' included, is
replayed by one launch per step: no layer waits for the host. Its capture allocates from one private pool as the
eager iteration does (``get_graph_pool`` :44-52), so it keeps no per-layer static buffers; what it keeps is a copy
of each micro-batch's input batch (``StaticBufferLoader`` :99-135, filled by ``data_read`` :151-161 for
``num_microbatches`` of them): tokens, labels and position ids (int64) and the loss mask (float32) of
megatron/training/utils.py ``get_batch_on_this_tp_rank`` at core_v0.19.0, 28 bytes a token.
"""

from __future__ import annotations

from autotune.cost.moe_time import static_dispatch
from autotune.cost.expert_host import grouped_mlp_host_s, post_sync_backward_host_s, post_sync_forward_host_s
from autotune.specs.hardware import ClusterSpec
from autotune.specs.layout import microbatches_in_flight, stage_layers
from autotune.specs.model import ModelSpec
from autotune.specs.nvfp4 import FP4_PRECISION
from autotune.specs.plan import FULL_ITERATION_GRAPH, ParallelPlan

__all__ = ["layer_kernels", "graphed_parts", "layer_launches", "launch_exposed_s", "host_launch_s", "host_issue_s",
           "cuda_graph_static_bytes", "STATIC_BATCH_BYTES_PER_TOKEN"]

# Bytes a token of one micro-batch's input batch holds: tokens, labels, position ids (int64) and the loss mask
# (float32), the tensors Megatron's get_batch hands the model (module docstring).
STATIC_BATCH_BYTES_PER_TOKEN = 3 * 8 + 4


def layer_kernels(model: ModelSpec, plan: ParallelPlan, moe_layer: bool) -> dict[str, tuple[int, int]]:
    """(GEMMs, other kernels) of one layer's forward, by part (the module docstring counts them)."""
    casts = {"fp8": 1, FP4_PRECISION: 2}.get(plan.precision, 0)
    tp = 2 if plan.tp > 1 else 0

    def part(gemms: int, others: int) -> tuple[int, int]:
        return gemms, others + gemms * casts + (tp if gemms else 0)

    out = {"attn": part(2, 4)}
    if not moe_layer:
        out["mlp"] = part(2, 3)
        return out
    moe = model.moe
    assert moe is not None
    out["moe_router"] = part(1, 4)
    out["moe_preprocess"] = part(0, 2)  # the dispatcher's preprocess: permutation 1 (its map and the permute)
    out["moe_rest"] = part(2 * moe.num_shared_experts, 7 + moe.num_shared_experts)
    return out


def graphed_parts(model: ModelSpec, plan: ParallelPlan, moe_layer: bool) -> tuple[str, ...]:
    """The parts of a layer its CUDA graphs capture (none without graphs; the whole layer: all but the dispatcher's,
    whose token counts change every step). Megatron's own graphs (local) capture the router and the preprocess
    together when either is named (transformer_config.py:2473-2482 of megatron-core 0.19.2)."""
    if plan.cuda_graph in (None, "none"):
        return ()
    parts = layer_kernels(model, plan, moe_layer)
    scope = plan.cuda_graph_scope
    if scope is None:
        return tuple(p for p in parts if p not in ("moe_rest", "moe_preprocess"))
    if plan.cuda_graph == "local" and {"moe_router", "moe_preprocess"} & set(scope):
        scope = (*scope, "moe_router", "moe_preprocess")
    return tuple(p for p in parts if p in scope)


def layer_launches(model: ModelSpec, plan: ParallelPlan, moe_layer: bool) -> tuple[int, int]:
    """(forward, backward) launches one layer issues beside its routed experts: a captured part one per pass, else
    its kernels (backward: two GEMMs per forward GEMM, one kernel per other kernel)."""
    graphed = graphed_parts(model, plan, moe_layer)
    fwd = bwd = 0
    for name, (gemms, others) in layer_kernels(model, plan, moe_layer).items():
        fwd += 1 if name in graphed else gemms + others
        bwd += 1 if name in graphed else 2 * gemms + others
    return fwd, bwd


def launch_exposed_s(model: ModelSpec, plan: ParallelPlan, moe_layer: bool, fwd_s: float, bwd_s: float,
                     launch_s: float, fp8_recipe: str | None = None, experts_fwd_s: float = 0.0) -> tuple[float, float]:
    """(forward, backward) seconds one layer waits for its kernel launches beyond its GPU work ``fwd_s`` /
    ``bwd_s`` (backward with its recompute): a captured part costs one launch per pass; an MoE layer's routed
    experts add their host time whole (``autotune.cost.expert_host``: issued after the dispatcher's host sync),
    or under EP overlap join the launches the layer's GPU work hides, but for what the forward experts issue after
    a clamped GLU's stream synchronisation, and the data gradient after its ``moe_act`` rerun's
    (``expert_host.post_sync_forward_host_s``, ``post_sync_backward_host_s``: the compute stream is drained then,
    nothing of the paired micro-batch is left to hide it). ``experts_fwd_s``: the routed experts' share of ``fwd_s``
    (their GPU work, which cannot hide their own issue: the lead a static dispatch keeps is the rest's)."""
    launch_s = host_launch_s(plan, launch_s)
    if launch_s <= 0:
        return 0.0, 0.0
    experts_f, experts_b = grouped_mlp_host_s(model, plan, fp8_recipe, launch_s) if moe_layer else (0.0, 0.0)
    fwd, bwd = layer_launches(model, plan, moe_layer)
    if moe_layer and static_dispatch(plan) and not plan.ep_overlapped:
        # Padded capacities leave the dispatcher no token counts to wait for (moe_time.static_dispatch): the host
        # reaches the experts with the lead it gained while the GPU ran the layer's work before them, and that lead
        # hides as much of the experts' issue time. The backward keeps the dropless treatment (no sync there either,
        # its lead taken as none: cost/expert_host.py).
        lead_f = max(0.0, fwd_s - experts_fwd_s - fwd * launch_s)
        return (max(0.0, fwd * launch_s - fwd_s) + max(0.0, experts_f - lead_f),
                max(0.0, bwd * launch_s - bwd_s) + experts_b)
    if plan.ep_overlapped:  # issued while the GPU runs the paired micro-batch's nodes (cost/expert_host.py)
        tail_f, tail_b = ((post_sync_forward_host_s(model, plan, fp8_recipe, launch_s),
                           post_sync_backward_host_s(model, plan, fp8_recipe, launch_s)) if moe_layer else (0.0, 0.0))
        return (max(0.0, fwd * launch_s + experts_f - tail_f - fwd_s) + tail_f,
                max(0.0, bwd * launch_s + experts_b - tail_b - bwd_s) + tail_b)
    return (max(0.0, fwd * launch_s - fwd_s) + experts_f, max(0.0, bwd * launch_s - bwd_s) + experts_b)


def host_issue_s(cluster: ClusterSpec, launch_s: float) -> float:
    """The engine's per-kernel launch time ``launch_s`` (an x86 host's) on this cluster's host: times its GPU's
    ``KernelFacts.host_issue_factor`` (1.0 where the GPU gives no kernel facts). The grouped GEMMs' per-call host time
    (``expert_host.CUBLASLT_GEMM_CALL_S``, measured on an SM100 system whose host its source does not name) is not
    scaled."""
    kernels = cluster.gpu.kernels
    return launch_s * (kernels.host_issue_factor if kernels is not None else 1.0)


def host_launch_s(plan: ParallelPlan, launch_s: float) -> float:
    """Seconds the host spends on a kernel launch inside a layer's passes: none where a full-iteration graph replays
    the whole forward-backward (module docstring), else the engine's ``launch_s``."""
    return 0.0 if plan.cuda_graph == FULL_ITERATION_GRAPH else launch_s


def cuda_graph_static_bytes(model: ModelSpec, plan: ParallelPlan, stage: int, scheme: str) -> float:
    """Bytes the captured graphs of pipeline stage ``stage`` keep: per captured part of each layer, per micro-batch
    in flight, its forward and backward graphs' static input and output buffers (the layer input's size each); a
    full-iteration graph: the static input batch of every micro-batch."""
    if plan.cuda_graph in (None, "none"):
        return 0.0
    if plan.cuda_graph == FULL_ITERATION_GRAPH:  # each micro-batch's input batch, nothing per layer (docstring)
        return STATIC_BATCH_BYTES_PER_TOKEN * plan.micro_batch_size * plan.seq_len / plan.cp * plan.num_microbatches
    first, count = stage_layers(model.num_layers, plan.pp, stage, scheme)
    t_seq = plan.tp if plan.sequence_parallel else 1
    layer_input = 2 * plan.seq_len / plan.cp * plan.micro_batch_size * model.hidden_size / t_seq
    parts = sum(len(graphed_parts(model, plan, model.is_moe_layer(i))) for i in range(first, first + count))
    if plan.cuda_graph == "transformer_engine":  # buffers shared along the chain of layer graphs (docstring)
        return 4 * layer_input if parts else 0.0
    return 4 * layer_input * parts * microbatches_in_flight(plan, stage)
