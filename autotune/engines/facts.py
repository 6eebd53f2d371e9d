"""What an engine declares about itself, as plain data: the plan dimensions it runs (:class:`EngineSupport`),
how it schedules communication (:class:`CommSchedule`), how its code saves activations
(:class:`ActivationFacts`), a rule it enforces (:class:`Rule`) and the files it writes (:class:`EngineFiles`).

The engine ABC (``autotune.engines.base``) and the support rules read these; so do the cost model, the
planner and the bundle above the engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Rule", "EngineSupport", "CommSchedule", "ActivationFacts", "MEGATRON_FACTS", "EXPERT_OUTPUT_SAVING_FACTS",
           "EngineFiles",
           "SELECTIVE_POLICIES", "KERNEL_LAUNCH_S", "EAGER_OP_S"]

# What selective recompute keeps (ActivationFacts.selective): Megatron's attention core; torchtitan's op-level SAC
# as 0.2.x saves (models/llama3/infra/parallelize.py _op_sac_save_list) or as 0.3 saves (its default save set adds
# aten._scaled_mm: every Float8 GEMM output kept).
SELECTIVE_POLICIES = ("attention-core", "op-sac", "op-sac-0.3")

# Host time per kernel launch when a stream of short kernels is issued back to back without a CUDA graph: 3.8 us per
# kernel for a 2.9 us kernel (NVIDIA Technical Blog, A. Gray, "Getting Started with CUDA Graphs", 2019,
# developer.nvidia.com/blog/cuda-graphs/: the launches, not the kernels, set the pace). A floor: PyTorch's per-op
# dispatch on top of it is not counted.
KERNEL_LAUNCH_S = 3.8e-6

# Host time per op an engine issues from Python in eager mode (Megatron-core's layers: each torch op or Transformer
# Engine call pays Python, the dispatcher and its launch): one torch.nn.Linear forward's CPU time, 13.48 us on an H100
# DGX host (Xeon Platinum 8480C), measured beside its GPU time in NVIDIA/TransformerEngine issue #2053 ("High CPU
# overhead on Grace systems", 2025-08-11: 37.08 us on GB200's Grace, ``KernelFacts.host_issue_factor``). The launch
# floor above is what a kernel issued from C++ costs (a collective's per-rank copies).
EAGER_OP_S = 13.48e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One refusal: which rule, the engine's own words for it, where the engine enforces it."""

    id: str
    message: str
    source: str

    def render(self) -> str:
        return f"{self.message} ({self.source})"


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSupport:
    """The plan dimensions an engine runs, and how it realises each one (None: not supported)."""

    tp: str | None
    """How tensor parallelism is done: "megatron" (column/row-parallel layers), "autotp", "dtensor"."""
    sequence_parallel: bool
    """Megatron-style sequence parallelism over the TP ranks (norms and dropout split along the sequence)."""
    pp: str | None
    """The pipeline engine: "megatron" (1F1B, interleaved), "deepspeed" (PipelineModule, 1F1B),
    "pipelining" (torch.distributed.pipelining)."""
    vpp: bool
    """Interleaved (virtual) pipeline stages."""
    layer_split: str
    """How uneven layer counts are split over stages: see ``autotune.specs.layout``."""
    tp_with_pp: bool
    cp: str | None
    """Context parallelism: "ring" (Megatron CP / torch ring attention) or "ulysses" (DeepSpeed all-to-all)."""
    ep: bool
    zero_stages: tuple[int, ...]
    """0-3 as this engine understands them (see :meth:`Engine.sharding`)."""
    zero_stages_with_pp: tuple[int, ...]
    offload_optimizer: tuple[str, ...] = ("none",)
    offload_param: tuple[str, ...] = ("none",)
    hybrid_shard: bool = False
    """A replicate x shard data-parallel mesh (FSDP2 HSDP)."""
    etp: bool = False
    """Expert tensor parallelism of its own (Megatron-core parallel folding, --expert-tensor-parallel-size)."""
    precisions: tuple[str, ...] = ("bf16", "fp16", "fp8")
    grad_dtypes: tuple[str, ...] = ()
    """Gradient dtypes other than the engine's default it runs and autotune models (``ParallelPlan.grad_dtype``)."""
    fp8_recipes: tuple[str, ...] = ()
    """FP8 scaling recipes a plan may ask of it (``ParallelPlan.fp8_recipe``); its default is ``CommSchedule``'s."""
    tp_overlaps: tuple[str, ...] = ("none",)
    """TP communication overlaps a plan may ask of it (``ParallelPlan.tp_overlap``)."""
    torch_compile: bool = False
    """Its files can turn torch.compile on (``ParallelPlan.torch_compile``)."""
    loss_chunks: bool = False
    """Its files can compute the output layer and loss in chunks (``ParallelPlan.loss_chunks``)."""
    cuda_graphs: tuple[str, ...] = ("none",)
    """CUDA graph implementations a plan may ask of it (``ParallelPlan.cuda_graph``, Megatron ``--cuda-graph-impl``)."""
    ep_overlaps: tuple[str, ...] = ("none",)
    """Expert-parallel all-to-all overlaps a plan may ask of it (``ParallelPlan.ep_overlap``, Megatron
    ``--overlap-moe-expert-parallel-comm``)."""
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    """MoE token dispatchers a plan may ask of it (``ParallelPlan.moe_dispatcher``, Megatron
    ``--moe-token-dispatcher-type``); an engine's expert parallelism runs all-to-alls unless it says more (torchtitan
    distributed/expert_parallel.py ``all_to_all_single``, DeepSpeed moe/sharded_moe.py ``_AllToAll``). torchtitan
    v0.2.1+ also has ``parallelism.expert_parallel_comm_backend = "deepep"`` (config/job_config.py:474 at v0.2.2),
    which autotune's torchtitan files do not write yet."""
    cp_comm_types: tuple[str, ...] = ()
    """Context-parallel exchanges a plan may ask of it (``ParallelPlan.cp_comm_type``, Megatron ``--cp-comm-type``);
    none: its context parallelism runs its own kind only (``CommSchedule.cp_kind``)."""
    peft: tuple[str, ...] = ()
    """Parameter-efficient fine-tuning methods a plan may ask of it (``ParallelPlan.peft``); none: it trains every
    weight."""
    activation_offload: bool = False
    """Its files can offload layers' saved activations to host memory (``ParallelPlan.activation_offload_layers``,
    Megatron-core ``--cpu-offloading-num-layers``)."""
    mtp: bool = False
    """Its files can train multi-token-prediction modules after the last layer (``ParallelPlan.mtp_layers``,
    Megatron-core ``--mtp-num-layers``)."""
    fp8_attention: bool = False
    """Its files can run the fused attention in FP8 (``ParallelPlan.fp8_attention``, Megatron-core
    ``fp8_dot_product_attention``); none: attention runs in 16 bits whatever the precision."""
    loss_slots: bool = False
    """Its files can give the output layer and loss more than one layer slot of the pipeline split
    (``ParallelPlan.loss_slots``: Megatron-core's --pipeline-model-parallel-layout, or its account-for flags;
    torchtitan's ``pipeline_parallel_last_stage_less_layers``)."""
    fp8_output_proj: bool = False
    """Its files can run the output layer (LM head) in MXFP8 (``ParallelPlan.fp8_output_proj``, Megatron-core
    ``fp8_output_proj``, core_v0.18+); none: the output layer is 16-bit whatever the precision."""
    token_drop: bool = False
    """Its files can drop tokens over an expert capacity (``ParallelPlan.moe_capacity_factor``, padded or not: Megatron
    ``--moe-expert-capacity-factor``); none: its MoE layers are dropless only."""
    recompute_modules: tuple[str, ...] = ()
    """The modules a plan may name for selective recompute (``ParallelPlan.recompute_modules``, Megatron
    ``--recompute-modules``); its default is the attention core."""

    def runs(self, name: str, value: object) -> bool:
        """Whether its files can run the run setting ``name`` (one of ``ParallelPlan``'s ``RUN_SETTINGS``) at
        ``value``; None, the engine's default, always runs. The one place that reads the fields above for it."""
        if value is None:
            return True
        return {"grad_dtype": lambda: value in self.grad_dtypes, "fp8_recipe": lambda: value in self.fp8_recipes,
                "tp_overlap": lambda: value in self.tp_overlaps,
                "torch_compile": lambda: not value or self.torch_compile,
                "loss_chunks": lambda: value == 1 or self.loss_chunks, "cuda_graph": lambda: value in self.cuda_graphs,
                "cuda_graph_scope": lambda: len(self.cuda_graphs) > 1, "ep_overlap": lambda: value in self.ep_overlaps,
                "moe_dispatcher": lambda: value in self.moe_dispatchers,
                "cp_comm_type": lambda: value in self.cp_comm_types,
                "recompute_modules": lambda: set(value) <= set(self.recompute_modules),
                "peft": lambda: value in self.peft,
                "activation_offload_layers": lambda: self.activation_offload,
                "mtp_layers": lambda: self.mtp,
                "moe_capacity_factor": lambda: self.token_drop,
                "fp8_attention": lambda: not value or self.fp8_attention,
                "fp8_output_proj": lambda: not value or self.fp8_output_proj,
                "moe_pad_to_capacity": lambda: not value or self.token_drop}.get(name, lambda: True)()


@dataclass(frozen=True, slots=True, kw_only=True)
class CommSchedule:
    """How an engine schedules its communication (what overlaps with compute, what is exposed)."""

    dp_overlap: str
    """Gradient reduction: "bucketed" (DeepSpeed overlap_comm / Megatron overlap-grad-reduce, hidden behind
    backward except the last bucket) or "per_layer" (FSDP2: reduce-scatter per wrapped block)."""
    param_gather: str
    """ZeRO-3 / FSDP parameter all-gathers: "prefetch" (DeepSpeed's coordinator, per submodule up to
    stage3_prefetch_bucket_size ahead, none past stage3_max_live_parameters: ``autotune.cost.zero3_gathers``),
    "fsdp2" (fully_shard implicit prefetch of the next block), "megatron-fsdp" (Megatron-FSDP under zero_stage 3:
    one gather per layer, the next prefetched into the other double buffer; ``autotune.engines.megatron_fsdp``),
    "none"; only a plan whose stage shards the weights gathers them."""
    pipeline_schedule: str | None
    """"1f1b", "interleaved-1f1b" (when vpp > 1), "deepspeed-1f1b" (TrainSchedule), None without PP."""
    cp_kind: str | None
    """How context parallelism exchanges K and V (``autotune.cost.cp_ring``): "p2p" (Megatron / Transformer
    Engine ring, ``--cp-comm-type p2p``), "allgather" (torch ``context_parallel``'s default rotate method) or
    "ulysses" (DeepSpeed all-to-all over heads)."""
    cp_repeat_kv: bool = False
    """The engine's model code repeats K and V to every query head before the attention op, so context
    parallelism exchanges them at the query width."""
    tp_overlap: str = "none"
    """How TP collectives overlap GEMMs by default: "none", "userbuffers" (Megatron ``--tp-comm-overlap``, TE
    userbuffers), "async-tp" (torch micro-pipelined TP, ``_micro_pipeline_tp``); a run may turn it on."""
    prefetch_layers: int = 1
    """ZeRO-3 / FSDP: blocks whose parameters are gathered ahead of the running one (the rest waits)."""
    attention_kernel: str = "fa2"
    """The fused attention kernel generation the engine runs: "fa2" (FlashAttention-2, torch SDPA's flash
    backend), "fa3" (Hopper-class: FlashAttention-3 / cuDNN fused attention through Transformer Engine)."""
    fp8_recipe: str = "te-delayed"
    """Default FP8 recipe: "te-delayed", "te-current" (Transformer Engine), "torchao-tensorwise",
    "torchao-rowwise" (torchao.float8)."""
    fp8_param_gather: bool = False
    """ZeRO-3 / FSDP gathers FP8 weights (torchao ``enable_fsdp_float8_all_gather``) instead of 16-bit ones."""
    grad_sync_every_microbatch: bool = False
    """Gradients reduced after every micro-batch (FSDP2, ZeRO-2/3 partitioned gradients), not once per step."""
    pp_scatter_gather: bool = False
    """Pipeline sends split over the TP ranks: each sends 1/tp of the activation over its own NIC and the next
    stage all-gathers it over NVLink (Narayanan et al. 2021 Sec. 4.1); otherwise every TP rank sends it whole."""
    pp_overlap_interleaved: bool = False
    """The interleaved pipeline schedule posts its steady-phase sends asynchronously behind the next chunk's compute
    (Megatron-core ``overlap_p2p_comm``); its warmup and cooldown sends still wait (``autotune.cost.pp_sends``)."""
    tp_backward_overlap: bool | str = False
    """The backward's TP collective of the input gradient runs asynchronously behind the weight-gradient GEMM
    (Megatron ``LinearWithGradAccumulationAndAsyncCommunication``, ``async_op=True``); "sequence-parallel": only
    the reduce-scatter of a sequence-parallel plan does (:meth:`tp_backward_overlapped`)."""
    param_gather_overlap: bool = False
    """ZeRO-1/2 / distributed optimizer: the all-gather of the updated 16-bit weights after the optimizer step runs
    behind the next forward (Megatron ``--overlap-param-gather``, emitted with overlap_comm). False: it runs inside
    the optimizer step and waits (DeepSpeed ``all_gather_dp_groups`` at the end of ``step()`` in
    runtime/zero/stage_1_and_2.py and runtime/bf16_optimizer.py)."""
    kernel_launch_s: float = 0.0
    """Host seconds to issue one kernel (``autotune.cost.launch``): a layer waits for its launches where they take
    longer than its GPU work, unless a CUDA graph issues them at once. 0: not modelled for the engine."""
    elementwise_kernels: str = "fused"
    """How the model's norms, activation and RoPE run: "fused" (one kernel each: Megatron / Transformer Engine)
    or "eager" (PyTorch modules op by op: torchtitan's and transformers' RMSNorm, SwiGLU, RoPE without
    torch.compile; ``autotune.cost.layer_time.EAGER_BYTES``)."""

    def tp_backward_overlapped(self, plan) -> bool:
        """Whether ``plan``'s backward TP collective hides behind the weight-gradient GEMM."""
        return self.tp_backward_overlap is True or (self.tp_backward_overlap == "sequence-parallel"
                                                     and plan.sequence_parallel)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationFacts:
    """How an engine's code saves activations, where engines differ (defaults: Megatron-LM / DeepSpeed)."""

    selective: str = "attention-core"
    """What ``recompute="selective"`` recomputes: "attention-core" (Korthikanti Sec. 5, Megatron
    ``--recompute-granularity selective``), "op-sac" (torchtitan 0.2 ``selective_ac_option = 'op'``:
    ``autotune.cost.activations.op_sac_layer_bytes``) or "op-sac-0.3" (torchtitan 0.3 ``SelectiveAC``, whose save
    set keeps the Float8 GEMMs' outputs)."""
    loss_backward_bytes_per_logit: float = 0.0
    """Bytes per (token, vocab entry of this GPU) the loss backward allocates beyond the saved fp32 softmax /
    log-probabilities, while every saved activation is still live. 0: Megatron's vocab-parallel cross entropy
    writes the gradient into the saved softmax (tensor_parallel/cross_entropy.py, ``grad_input = softmax``).
    8: aten ``log_softmax`` + ``nll_loss`` on fp32 logits (``nll_loss_backward`` allocates a zero fp32
    gradient, ``_log_softmax_backward_data`` a second one; torchtitan train.py ``loss_fn``). 12: DTensor
    ``loss_parallel`` (torch/distributed/tensor/parallel/loss.py ``_nll_loss_and_log_softmax_backward``:
    ``zeros_like(x)``, ``exp(x)``, their sum and its product with the output gradient)."""
    loss_logit_bytes: float = 4.0
    """Bytes per (token, vocab entry of this GPU) the loss keeps for backward. 4: an fp32 softmax or log-softmax
    of the logits (Megatron's vocab-parallel cross entropy, torchtitan's ``logits.float()``). 2: Transformer Engine's
    ``parallel_cross_entropy`` (``MemorySettings.te_cross_entropy``), which writes the gradient into the 16-bit
    logits during its forward and saves them, nothing else of that size (TransformerEngine@v2.14
    transformer_engine/pytorch/cross_entropy.py:53-64, triton/cross_entropy.py:36-105 and :114-140)."""
    gathered_linear_inputs: bool = False
    """With sequence parallelism, column-parallel linears (QKV, fc1, output layer) save their all-gathered
    input (DTensor ``ColwiseParallel`` after ``PrepareModuleInput`` to ``Replicate``), not the SP shard
    (Megatron's ``LinearWithGradAccumulationAndAsyncCommunication`` saves the shard and gathers it again)."""
    fp8_input_bytes: int = 1
    """Bytes per element an FP8 linear saves of its input: 1 (Transformer Engine saves the FP8 cast);
    2 (torchao float8 ``matmul_with_hp_or_float8_args`` saves the high-precision input, casts in backward)."""
    moe_expert_outputs_saved: bool = False
    """Whether an MoE layer keeps each routed pair's expert output (16-bit, ``h`` wide) for the gradient of its
    routing weight. False: Megatron-core multiplies the routing probabilities inside the experts' activation
    (megatron/core/transformer/moe/experts.py at d98e8a64, ``bias_act_func`` :943-1027, "Activation and post-multiply
    probs" :545), so the combine is a plain un-permutation whose backward needs no data (token_dispatcher.py
    ``combine_postprocess`` :876-900 calls ``unpermute`` without probabilities). True: the weight multiplies the
    expert output after the experts (Hugging Face Mixtral-style blocks ``expert_layer(x) * routing_weights``,
    DeepSpeed-MoE ``sharded_moe.py`` ``einsum("sec,ecm->sm", combine_weights, expert_output)``, torchtitan's MoE
    scaling the routed output by its scores), which saves that output."""
    fp8_attention_recipe: str | None = None
    """The FP8 recipe the fused attention runs in (``ParallelPlan.fp8_attention``: Megatron-core
    ``fp8_dot_product_attention``), which sets the bytes of Q, K, V and its output it saves for backward
    (``autotune.cost.fp8_attention.saved_bytes``); None: a 16-bit attention (Q, K, V and the output in 16 bits)."""
    cp_kind: str | None = None
    """How the plan's context parallelism runs (``CommSchedule.cp_kind``; the ledger sets it from the engine's
    schedule when cp > 1): its attention's K/V buffers join the backward's working set."""
    cp_repeat_kv: bool = False
    """Those buffers at the query width (``CommSchedule.cp_repeat_kv``)."""
    cp_node_gpus: int = 8
    """GPUs per node, which split a2a+p2p context parallelism (``autotune.specs.context_parallel``)."""


MEGATRON_FACTS = ActivationFacts()
EXPERT_OUTPUT_SAVING_FACTS = ActivationFacts(moe_expert_outputs_saved=True)
"""Megatron-LM's facts but for the MoE combine (DeepSpeed, Megatron-DeepSpeed and Hugging Face models)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFiles:
    """What an engine writes for a plan, and how the launch scripts start it."""

    files: dict[str, str]
    entry: str
    """The training program (a script path, or ``-m module``)."""
    program_args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    launcher: str = "torchrun"
    """"torchrun" or "deepspeed": which launcher the emitted scripts use."""
    user_script_needs: tuple[str, ...] = ()
    """What a user's own training script must provide to reproduce the plan (for plan.md)."""
