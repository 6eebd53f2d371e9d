"""The knobs of a run that change its memory: engine bucket sizes, the CUDA context, NCCL buffers, the
allocator's fragmentation reserve, the selective-recompute policy, NVMe offload buffers.

Typed data only: the ledger (``autotune.cost.memory``) reads it, the engines size their buffers from it and
the DeepSpeed writer writes its bucket sizes from it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MemorySettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySettings:
    """Engine settings and overheads the ledger needs. Defaults are DeepSpeed's and Megatron's."""

    reduce_bucket_size: int = 500_000_000
    """DeepSpeed ``zero_optimization.reduce_bucket_size`` (elements)."""
    allgather_bucket_size: int = 500_000_000
    """DeepSpeed ``zero_optimization.allgather_bucket_size`` (elements)."""
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    cuda_context_bytes: int | None = None
    """CUDA context and cuBLAS/cuDNN workspaces, outside the caching allocator. None: 0.75 GiB on a GPU
    (a CUDA 12 context is ~0.5 GiB on H100, cuBLAS workspaces and kernels images the rest), 0 on ``cpu``."""
    nccl_bytes_per_communicator: int | None = None
    """NCCL buffers per process group of more than one rank. None: 256 MiB on a GPU (NCCL_BUFFSIZE 4 MiB
    per channel and peer, 2 ring peers, up to 32 channels), 0 on ``cpu`` (gloo)."""
    fragmentation_fraction: float = 0.10
    """Caching-allocator reserve beyond the allocated peak, as a fraction of it (fragmentation and 2 MiB /
    20 MiB segment rounding, blocks cached per stream). Fitted (``python bench/fit_fragmentation.py``: the
    smallest median |error|) on the 13 published runs with a peak memory: 9 torchtitan H100 runs
    (``max_memory_reserved``, Llama 3.1 8B / 70B / 405B, FSDP2 / TP / PP / CP, bf16 and Float8) and 4 BLOOM
    tr11 runs (nvidia-smi, Megatron-DeepSpeed). The only fitted memory parameter."""
    expandable_segments: bool | None = None
    """The run sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (True), or not (False); None: as the engine's
    own launcher does (``Engine.expandable_segments``: torchtitan's run_train.sh sets it). With it the caching allocator maps physical pages
    into one growing segment per stream and, when memory runs out, "can unmap all the memory in our segment
    corresponding to empty physical pages, and return it to CUDA for use at another address" (PyTorch
    c10/cuda/CUDACachingAllocator.cpp, Note [Expandable Segments], at pytorch/pytorch@001074d2; 20 MiB pages in the
    large pool, 2 MiB in the small one). The fragmentation reserve (``fragmentation_fraction``) is then cached pages
    the allocator hands back rather than fail, so the ledger's device total (``MemoryEstimate.total``, what ``fits``
    is judged on) leaves it out; ``reserved`` (``max_memory_reserved`` when nothing presses the allocator) keeps it.
    Not counted: the partly used pages at the edges of free ranges (under 20 MiB each). NVIDIA's launcher sets it
    for the runs that otherwise hit "allocator fragmentation OOM": Megatron-Bridge@c810129341a8
    scripts/performance/perf_plugins.py:265-273 and :293-297 ("expandable_segments lets the allocator reclaim
    fragmented physical memory and avoids the OOM")."""
    linear_inputs_gathered: bool | None = None
    """Under sequence parallelism, whether the column-parallel linears (QKV, fc1, output layer) save their
    sequence-gathered input (torchtitan's DTensor TP) or only the sequence-parallel shard, re-gathered in backward
    (Korthikanti et al. 2022 Sec. 4.2.2, Megatron): ``ActivationFacts.gathered_linear_inputs`` where the run's code
    differs from its engine's; None: the engine's own."""
    grad_accumulation_sharded: bool | None = None
    """Under pipelining with data-parallel sharding, whether each micro-batch's gradients are reduce-scattered into
    the sharded fp32 gradients as its backward ends (True) or accumulated unsharded over the step's micro-batches and
    reduce-scattered after the last (False: torch.distributed.pipelining with FSDP2, ``autotune.engines.fsdp``).
    Meta's Llama 3 stack (arXiv 2407.21783 Sec. 3.3.2): "Our use of FSDP for Llama 3 shards optimizer states and
    gradients" and "we use FP32 gradients accumulation during backward computation over multiple micro-batches and
    also reduce-scatter gradients in FP32 across data parallel workers in FSDP". None: the engine's own. The ledger's
    setting only: the step time (``autotune.cost.step_time``) still charges one reduction a step."""
    pipeline_buffers_released: bool | None = None
    """Whether a pipeline stage frees its received input and its output as soon as no later computation reads them
    (True: only the in-transit receives are held) or keeps torch.distributed.pipelining's per-micro-batch receive
    buffers and output cache (False, ``FSDPEngine._pipeline_buffers``). Meta's Llama 3 stack (arXiv 2407.21783
    Sec. 3.3.2): "we proactively deallocate tensors that will not be used for future computation, including the
    input and output tensors of each pipeline stage". None: the engine's own."""
    te_cross_entropy: bool | None = None
    """The loss is Transformer Engine's ``parallel_cross_entropy`` (True) or keeps an fp32 softmax of the logits
    (False); None: the engine's own (Megatron-LM's default, ``--cross-entropy-loss-fusion`` off: the fp32
    vocab-parallel cross entropy). TE's kernel computes the loss and the gradient in its forward, writes the
    gradient over the 16-bit logits and saves them (TransformerEngine@v2.14 transformer_engine/pytorch/
    cross_entropy.py:53-64: ``ctx.save_for_backward(inp.detach())``; triton/cross_entropy.py:36-105: fp32 buffers of
    3 values per token only), and its backward returns them, scaled in place (triton/cross_entropy.py:114-140): the loss keeps 2
    bytes per logit, not 4 (``ActivationFacts.loss_logit_bytes``), and allocates nothing of that size in backward.
    What NVIDIA's Megatron-Bridge runs: ``cross_entropy_loss_fusion`` True by default (Megatron-Bridge@c810129341a8
    src/megatron/bridge/models/gpt_provider.py:196) with ``cross_entropy_fusion_impl = "te"`` in every benchmark
    run (scripts/performance/utils/overrides.py:67-68 ``_set_common_perf_overrides``), which megatron-core 0.19
    sends to TE (models/common/language_module/language_module.py:167-190). Transformer Engine 2.18 changed it: the
    forward writes the gradient into a new fp32 tensor and saves that alone (TransformerEngine 01bbe3eea, 2026-07-09,
    "Fix the numerical issue with the Fused CE loss" #3193: triton/cross_entropy.py ``grad_input =
    torch.empty_like(_input, dtype=torch.float32)``), 4 bytes per logit, as the fp32 softmax's: a run on TE >= 2.18
    is costed with False."""
    selective_policy: str | None = None
    """What selective recompute keeps, where the run's code says ("attention-core", "op-sac": see
    ``autotune.cost.activations.ActivationFacts.selective``); None: the engine's own."""
    cp_repeat_kv: bool | None = None
    """The model code repeats K and V to every query head before attention (``TimeSettings.cp_repeat_kv``): the
    context-parallel K/V buffers at the query width; None: the engine's default (``CommSchedule.cp_repeat_kv``)."""
    offload_buffer_bytes: int = 5 * 100_000_000 * 2
    """Pinned host/GPU buffers of NVMe offload: ``buffer_count`` 5 x ``buffer_size`` 1e8 x 2 B."""
