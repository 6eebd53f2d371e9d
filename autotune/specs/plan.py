"""ParallelPlan: one decision of how to train (the thing the planner enumerates).

The plan holds only decisions. Facts that follow from them (world size, micro-batches,
tokens per step) are one-line properties here and nowhere else. Whether a plan suits a model
and a cluster is checked by :func:`autotune.rules.plan_problems`, which reports every
violated rule at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from autotune.errors import require_no_problems
from autotune.specs.frozen import copier
from autotune.specs.peft import PEFT_SETTINGS, peft_problems
from autotune.specs.plan_values import (  # noqa: F401  (re-exported: the plan's vocabularies)
    ENGINE_NAMES, EngineName, Recompute, Offload, Optimizer, PlanPrecision, GradDtype, FP8_RECIPES, Fp8Recipe,
    FP8_BLOCK_SCALE_BYTES, FP8_RECIPE_CAPABILITY, TP_OVERLAPS, TpOverlap, RECOMPUTE_MODULES, CUDA_GRAPHS,
    FULL_ITERATION_GRAPH, CUDA_GRAPH_SCOPES, EP_OVERLAPS, MOE_DISPATCHERS, CP_COMM_TYPES, RUN_SETTINGS,
    OPTIMIZER_STATE_BYTES, capacity_problems, fp8_attention_problems, fp8_output_proj_problems, loss_slots_problems,
)

__all__ = ["ParallelPlan", "OPTIMIZER_STATE_BYTES", "ENGINE_NAMES", "EngineName", "Recompute", "Offload", "Optimizer",
           "FP8_RECIPES", "FP8_BLOCK_SCALE_BYTES", "FP8_RECIPE_CAPABILITY", "TP_OVERLAPS", "RECOMPUTE_MODULES",
           "CUDA_GRAPHS", "CUDA_GRAPH_SCOPES", "FULL_ITERATION_GRAPH", "PRECISIONS", "EP_OVERLAPS", "MOE_DISPATCHERS",
           "CP_COMM_TYPES", "RUN_SETTINGS"]

_INT_ONLY = {int}
_TP_OVERLAP_VALUES = (None, *TP_OVERLAPS)
_RECOMPUTES = ("none", "selective", "full")
_OFFLOADS = ("none", "cpu", "nvme")
PRECISIONS = ("bf16", "fp16", "fp8", "fp4")  # the training precisions a plan may take
_PRECISIONS = PRECISIONS
_CHOICES = {
    "engine": ENGINE_NAMES,
    "recompute": _RECOMPUTES,
    "offload_optimizer": _OFFLOADS,
    "offload_param": _OFFLOADS,
    "precision": _PRECISIONS,
    "optimizer": tuple(OPTIMIZER_STATE_BYTES),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelPlan:
    """How one training job is split and run. Sizes are per data-parallel replica unless noted."""

    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel stages."""
    dp: int = 1
    """Data-parallel replicas (ZeRO partitions over these)."""
    cp: int = 1
    """Context-parallel size (sequence split for attention, Megatron ring attention)."""
    vpp: int = 1
    """Virtual pipeline chunks per stage (interleaved 1F1B when > 1)."""
    ep: int = 1
    """Expert-parallel size (MoE only); carved out of dp x cp, or out of tp x dp x cp with ``etp``."""
    etp: int | None = field(default=None, repr=False)
    """Expert-tensor-parallel size (Megatron-core parallel folding, ``--expert-tensor-parallel-size``): the
    expert layers' own TP; None: the dense tp (Megatron's default, arguments.py:587)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropout split along the sequence over TP ranks."""
    zero_stage: int = 0
    """0-3. Under Megatron, stage 1 is the distributed optimizer."""
    offload_optimizer: Offload = "none"
    offload_param: Offload = "none"
    nvme_path: str | None = None
    """Local NVMe folder for ``nvme`` offload."""
    micro_batch_size: int = 1
    grad_accum_steps: int = 1
    global_batch_size: int = 1
    """Sequences per optimizer step over all replicas."""
    seq_len: int = 2048
    recompute: Recompute = "none"
    recompute_num_layers: int | None = None
    """With full recompute: layers per pipeline stage to recompute (Megatron's block method); None: all."""
    precision: PlanPrecision = "bf16"
    optimizer: Optimizer = "adamw"
    engine: EngineName = "deepspeed"
    """The engine that trains the plan (``autotune.engines``): it decides what tp, pp, cp and zero_stage mean
    in practice (AutoTP or Megatron TP, Ulysses or ring CP, ZeRO or FSDP sharding)."""
    dp_replicate: int = 1
    """Hybrid sharding (FSDP2 HSDP): replica groups of the dp ranks; model states are sharded within a
    group of dp / dp_replicate ranks and replicated across groups. 1: shard over all dp ranks."""
    flash_attention: bool = True
    """Fused (flash) attention: no s^2 score tensors are kept for backward."""
    grad_dtype: GradDtype | None = field(default=None, repr=False)
    """The dtype gradients are accumulated and reduced in. None: the engine's default (Megatron: fp32
    ``main_grad`` buffers with bf16 / FP8, arguments.py sets ``accumulate_allreduce_grads_in_fp32``). "bf16":
    Megatron ``--grad-reduce-in-bf16`` (Bridge ``ddp.grad_reduce_in_fp32: false``), as NVIDIA's Megatron-Bridge
    benchmark recipes run (perf_recipes/_common.py ``_benchmark_common``): half the gradient buffer and half the
    data-parallel reduction bytes, at bf16's accumulation precision. Engines that do not model it refuse it."""
    overlap_comm: bool = True
    """Overlap data-parallel gradient reduction (and parameter gathers) with compute: DeepSpeed
    ``overlap_comm``, Megatron ``--overlap-grad-reduce --overlap-param-gather``."""
    fp8_recipe: Fp8Recipe | None = field(default=None, repr=False)
    """FP8 plans: the scaling recipe (:data:`FP8_RECIPES`). None: the engine's default (Megatron: TE delayed
    scaling; torchtitan: torchao tensorwise with FP8 all-gather)."""
    tp_overlap: TpOverlap | None = field(default=None, repr=False)
    """How TP collectives overlap the GEMMs (:data:`TP_OVERLAPS`). None: the engine's default (none)."""
    torch_compile: bool | None = field(default=None, repr=False)
    """torch.compile of the model (torchtitan ``compile.enable``). None: the engine's default (torchtitan's files
    compile FP8 and async-TP plans, ``autotune.emit.torchtitan.torchtitan_compiles``)."""
    loss_chunks: int | None = field(default=None, repr=False)
    """The output layer and loss computed in this many chunks of the sequence, each chunk's backward at once
    (torchtitan 0.3 ``ChunkedLossWrapper``, 8 in its recipes): 1/n of the fp32 logits live at a time. None: the
    engine's default (unchunked)."""
    recompute_modules: tuple[str, ...] | None = field(default=None, repr=False)
    """With ``recompute="selective"``: the modules recomputed in backward (:data:`RECOMPUTE_MODULES`, Megatron
    ``--recompute-modules``). None: the engine's default (Megatron-core: ``["core_attn"]``, transformer_config.py:1763
    of megatron-core 0.19.2)."""
    cuda_graph: str | None = field(default=None, repr=False)
    """CUDA graphs of the training layers (:data:`CUDA_GRAPHS`, Megatron ``--cuda-graph-impl``): one graph launch
    replaces each captured part's kernel launches ("full-iteration": those of the whole forward-backward). None: the
    engine's default (none)."""
    cuda_graph_scope: tuple[str, ...] | None = field(default=None, repr=False)
    """With CUDA graphs: the parts of each layer captured (:data:`CUDA_GRAPH_SCOPES`); None: the whole layer."""
    ep_overlap: str | None = field(default=None, repr=False)
    """Expert-parallel all-to-all overlap (:data:`EP_OVERLAPS`, Megatron ``--overlap-moe-expert-parallel-comm``
    [``--delay-wgrad-compute``]). None: the engine's default (none)."""
    moe_dispatcher: str | None = field(default=None, repr=False)
    """The MoE token dispatcher (:data:`MOE_DISPATCHERS`, Megatron ``--moe-token-dispatcher-type``
    [``--moe-flex-dispatcher-backend``]). None: the engine's default (alltoall)."""
    cp_comm_type: str | None = field(default=None, repr=False)
    """Context parallelism's attention exchange (:data:`CP_COMM_TYPES`, Megatron ``--cp-comm-type``). None: the
    engine's own (``CommSchedule.cp_kind``)."""
    activation_offload_layers: int | None = field(default=None, repr=False)
    """Activation CPU offload (Megatron-core ``--cpu-offloading-num-layers N``, Transformer Engine's
    ``get_cpu_offload_context``): the saved activations of the first N transformer layers are copied to host
    memory in forward and back in backward on a side stream (``autotune.cost.activation_offload``). None: none
    offloaded (the engine's default)."""
    mtp_layers: int | None = field(default=None, repr=False)
    """Multi-token prediction (Megatron-core ``--mtp-num-layers N``, DeepSeek-V3's MTP): N more modules after the
    last layer, each a 2h -> h projection of the hidden state joined with the next token's embedding, one layer like
    the model's last and the shared output layer with its own loss, all on the last pipeline stage
    (``autotune.cost.mtp``). None: none trained (the engines' default)."""
    moe_capacity_factor: float | None = field(default=None, repr=False)
    """Token dropping: each expert's capacity in multiples of its balanced share of a rank's routed tokens (Megatron
    ``--moe-expert-capacity-factor``, plan_values' note); the rest are dropped. None: dropless (engines' default)."""
    moe_pad_to_capacity: bool | None = field(default=None, repr=False)
    """With a capacity factor: each expert's input padded to its capacity (Megatron
    ``--moe-pad-expert-input-to-capacity``): static shapes, at the padded rows' cost. None: not padded."""
    fp8_attention: bool | None = field(default=None, repr=False)
    """FP8 plans: the fused attention in FP8 (Megatron-core ``fp8_dot_product_attention``; cost:
    ``autotune.cost.fp8_attention``). None: the engine's default (16-bit attention)."""
    fp8_output_proj: bool | None = field(default=None, repr=False)
    """FP8 plans under the MXFP8 recipe: the output layer (LM head) in MXFP8 too (Megatron-core ``fp8_output_proj``,
    core_v0.18+; cost: ``autotune.cost.fp8_head``). None: the engine's default (a 16-bit output layer)."""
    loss_slots: int | None = field(default=None, repr=False)
    """Megatron, pp > 1: the split counts the embedding as a layer's slot and the output layer + loss as this many
    (``autotune.specs.layout.split_scheme``). None: the engine's own split."""
    peft: str | None = field(default=None, repr=False)
    """Parameter-efficient fine-tuning (``autotune.specs.peft``): "lora" freezes every base weight and trains
    low-rank adapters (Megatron-Bridge ``peft=LoRA``). None: every weight trains."""
    lora_rank: int | None = field(default=None, repr=False)
    """LoRA's rank (Bridge ``LoRA.dim``); None: Bridge's default (``autotune.specs.peft.LORA_DEFAULT_RANK``)."""
    lora_alpha: float | None = field(default=None, repr=False)
    """LoRA's scale numerator (Bridge ``LoRA.alpha``; no cost); None: Bridge's default."""
    lora_targets: tuple[str, ...] | None = field(default=None, repr=False)
    """The linear layers given adapters (``autotune.specs.peft.LORA_TARGETS``); None: all four (Bridge's default)."""

    def __post_init__(self) -> None:
        # Fast path (the planner builds ~10^5 plans per search): every field valid, nothing to report.
        counts = (self.tp, self.pp, self.dp, self.cp, self.vpp, self.ep, self.dp_replicate, self.micro_batch_size,
                  self.grad_accum_steps, self.global_batch_size, self.seq_len)
        if (set(map(type, counts)) == _INT_ONLY and min(counts) >= 1 and self.zero_stage in (0, 1, 2, 3)
                and self.engine in ENGINE_NAMES and self.recompute in _RECOMPUTES and self.precision in _PRECISIONS
                and self.offload_optimizer in _OFFLOADS and self.offload_param in _OFFLOADS
                and self.optimizer in OPTIMIZER_STATE_BYTES and self.recompute_num_layers is None
                and self.etp is None and self.dp % self.dp_replicate == 0
                and (self.grad_dtype is None and self.fp8_recipe is None and self.tp_overlap is None
                     and self.torch_compile is None and self.loss_chunks is None and self.recompute_modules is None
                     and self.cuda_graph is None and self.cuda_graph_scope is None and self.ep_overlap is None
                     and self.moe_dispatcher is None and self.cp_comm_type is None and self.peft is None
                     and self.activation_offload_layers is None and self.mtp_layers is None
                     and self.moe_capacity_factor is None and self.moe_pad_to_capacity is None
                     and self.fp8_attention is None and self.fp8_output_proj is None and self.loss_slots is None
                     and self.lora_rank is None and self.lora_alpha is None and self.lora_targets is None
                     or self._run_settings_valid())):
            return
        problems = []
        for name in ("tp", "pp", "dp", "cp", "vpp", "ep", "dp_replicate", "micro_batch_size", "grad_accum_steps",
                     "global_batch_size", "seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                problems.append(f"{name} must be a positive integer, got {v!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            problems.append(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                problems.append(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.recompute_num_layers is not None and (
            not isinstance(self.recompute_num_layers, int) or self.recompute_num_layers < 1
        ):
            problems.append(f"recompute_num_layers must be a positive integer or absent, got {self.recompute_num_layers!r}")
        n_off = self.activation_offload_layers
        if n_off is not None and (not isinstance(n_off, int) or isinstance(n_off, bool) or n_off < 1):
            problems.append(f"activation_offload_layers must be a positive integer or absent (none offloaded), "
                            f"got {n_off!r}")
        n_mtp = self.mtp_layers
        if n_mtp is not None and (not isinstance(n_mtp, int) or isinstance(n_mtp, bool) or n_mtp < 1):
            problems.append(f"mtp_layers must be a positive integer or absent (no multi-token prediction), got {n_mtp!r}")
        if self.etp is not None and (not isinstance(self.etp, int) or isinstance(self.etp, bool) or self.etp < 1):
            problems.append(f"etp must be a positive integer or absent, got {self.etp!r}")
        if self.grad_dtype not in (None, "bf16"):
            problems.append(f"grad_dtype must be bf16 or absent (the engine's default), got {self.grad_dtype!r}")
        if self.fp8_recipe is not None:
            if self.fp8_recipe not in FP8_RECIPES:
                problems.append(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)} or absent (the engine's "
                                f"default), got {self.fp8_recipe!r}")
            elif self.precision != "fp8":
                problems.append(f"fp8_recipe ({self.fp8_recipe}) is for fp8 plans, and this one trains in "
                                f"{self.precision}: drop the recipe or use precision fp8")
        if self.tp_overlap not in (None, *TP_OVERLAPS):
            problems.append(f"tp_overlap must be one of {', '.join(TP_OVERLAPS)} or absent (the engine's default), "
                            f"got {self.tp_overlap!r}")
        longest = self.seq_len if isinstance(self.seq_len, int) else 2**31
        if self.loss_chunks is not None and (not isinstance(self.loss_chunks, int) or isinstance(self.loss_chunks, bool)
                                             or not 1 <= self.loss_chunks <= longest):
            problems.append(f"loss_chunks must be an integer from 1 to the sequence length ({self.seq_len}) or absent "
                            f"(the engine's default), got {self.loss_chunks!r}")
        if not (self.torch_compile is None or isinstance(self.torch_compile, bool)):
            problems.append(f"torch_compile must be true, false or absent (the engine's default), "
                            f"got {self.torch_compile!r}")
        problems += self._recompute_module_problems() + self._cuda_graph_problems()
        peft, targets = peft_problems(self.peft, self.lora_rank, self.lora_alpha, self.lora_targets)
        problems += peft
        if targets is not None:
            object.__setattr__(self, "lora_targets", targets)
        if self.ep_overlap not in (None, *EP_OVERLAPS):
            problems.append(f"ep_overlap must be one of {', '.join(EP_OVERLAPS)} or absent (the engine's default), "
                            f"got {self.ep_overlap!r}")
        if self.moe_dispatcher not in (None, *MOE_DISPATCHERS):
            problems.append(f"moe_dispatcher must be one of {', '.join(MOE_DISPATCHERS)} or absent (the engine's "
                            f"default), got {self.moe_dispatcher!r}")
        if self.cp_comm_type not in (None, *CP_COMM_TYPES):
            problems.append(f"cp_comm_type must be one of {', '.join(CP_COMM_TYPES)} or absent (the engine's "
                            f"default), got {self.cp_comm_type!r}")
        problems += capacity_problems(self.moe_capacity_factor, self.moe_pad_to_capacity)
        problems += fp8_attention_problems(self.fp8_attention, self.precision)
        problems += fp8_output_proj_problems(self.fp8_output_proj, self.precision, self.fp8_recipe)
        problems += loss_slots_problems(self.loss_slots, self.pp)
        if isinstance(self.moe_capacity_factor, int) and not isinstance(self.moe_capacity_factor, bool):
            object.__setattr__(self, "moe_capacity_factor", float(self.moe_capacity_factor))  # JSON's 1 is 1.0
        if not problems and self.dp % self.dp_replicate:
            problems.append(f"dp_replicate ({self.dp_replicate}) must divide dp ({self.dp})")
        require_no_problems(problems, subject="plan")

    def _recompute_module_problems(self) -> list[str]:
        """Checks ``recompute_modules`` and stores it as a tuple in :data:`RECOMPUTE_MODULES` order (a plan read
        from JSON holds a list)."""
        modules = self.recompute_modules
        if modules is None:
            return []
        if isinstance(modules, str) or not isinstance(modules, (list, tuple)) or not modules:
            return [f"recompute_modules must be a non-empty list of {', '.join(RECOMPUTE_MODULES)} or absent (the "
                    f"engine's default), got {modules!r}"]
        unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
        if unknown:
            return [f"recompute_modules: {', '.join(map(repr, unknown))} is not one of {', '.join(RECOMPUTE_MODULES)}"]
        object.__setattr__(self, "recompute_modules", tuple(m for m in RECOMPUTE_MODULES if m in modules))
        if self.recompute != "selective":
            return [f"recompute_modules ({' '.join(self.recompute_modules)}) says what selective recompute reruns, "
                    f"and this plan's recompute is {self.recompute}: use --recompute selective or drop "
                    f"--recompute-modules"]
        return []

    def _cuda_graph_problems(self) -> list[str]:
        if self.cuda_graph not in (None, *CUDA_GRAPHS):
            return [f"cuda_graph must be one of {', '.join(CUDA_GRAPHS)} or absent (the engine's default), "
                    f"got {self.cuda_graph!r}"]
        scope = self.cuda_graph_scope
        if scope is None:
            return []
        if isinstance(scope, str) or not isinstance(scope, (list, tuple)) or not scope or any(
                m not in CUDA_GRAPH_SCOPES for m in scope):
            return [f"cuda_graph_scope must be a non-empty list of {', '.join(CUDA_GRAPH_SCOPES)} or absent (the "
                    f"whole layer), got {scope!r}"]
        object.__setattr__(self, "cuda_graph_scope", tuple(m for m in CUDA_GRAPH_SCOPES if m in scope))
        if self.cuda_graph in (None, "none"):
            return ["cuda_graph_scope says what CUDA graphs capture, and this plan has none: add --cuda-graph local "
                    "or transformer_engine, or drop --cuda-graph-scope"]
        if self.cuda_graph == FULL_ITERATION_GRAPH:  # megatron/training/arguments.py:1888-1890 of core_v0.19.0
            return ["cuda_graph_scope names parts of a layer, and a full-iteration CUDA graph captures the whole "
                    "iteration (Megatron: --cuda-graph-modules must be empty with --cuda-graph-impl full_iteration): "
                    "drop --cuda-graph-scope, or use --cuda-graph local or transformer_engine"]
        return []

    def _run_settings_valid(self) -> bool:
        """The fast path's check of run settings that are set (a search of an engine release with defaults of its
        own builds every plan with them): each valid, as the full check below has it."""
        chunks, compiled = self.loss_chunks, self.torch_compile
        if (self.recompute_modules is not None or self.cuda_graph is not None or self.cuda_graph_scope is not None
                or self.ep_overlap is not None or self.moe_dispatcher is not None or self.cp_comm_type is not None
                or self.peft is not None or self.lora_rank is not None or self.lora_alpha is not None
                or self.lora_targets is not None or self.activation_offload_layers is not None
                or self.mtp_layers is not None or self.loss_slots is not None
                or self.moe_capacity_factor is not None or self.moe_pad_to_capacity is not None):
            return False  # the full check validates them and stores them as ordered tuples
        return (self.grad_dtype in (None, "bf16") and self.tp_overlap in _TP_OVERLAP_VALUES
                and (self.fp8_recipe is None or (self.fp8_recipe in FP8_RECIPES and self.precision == "fp8"))
                and (compiled is None or type(compiled) is bool)
                and (self.fp8_attention is None or (type(self.fp8_attention) is bool and self.precision == "fp8"))
                and (self.fp8_output_proj is None or (type(self.fp8_output_proj) is bool
                                                      and (not self.fp8_output_proj or self.fp8_recipe == "te-mxfp8")))
                and (chunks is None or (type(chunks) is int and 1 <= chunks <= self.seq_len)))

    # ---- derived facts (the one place) -------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def model_parallel_size(self) -> int:
        """GPUs one model replica spans: tp x pp x cp."""
        return self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel size of the expert layers: etp, else tp."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_zero_partitions(self) -> int:
        """Ranks that shard one expert's optimizer states: the expert data-parallel size, world / (etp x ep x pp)
        (megatron/core/parallel_state.py:880), within one replica group."""
        return max(1, self.zero_partitions * self.tp // (self.ep * self.expert_tp))

    @property
    def num_microbatches(self) -> int:
        """Micro-batches each pipeline runs per step (= gradient accumulation steps)."""
        return self.grad_accum_steps

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def ep_overlapped(self) -> bool:
        """The expert-parallel all-to-alls run behind another micro-batch's compute (``ep_overlap``)."""
        return self.ep_overlap not in (None, "none")

    @property
    def interleaved(self) -> bool:
        return self.pp > 1 and self.vpp > 1

    @property
    def zero_partitions(self) -> int:
        """Ranks that partition ZeRO / distributed-optimizer / FSDP state: dp x cp (Megatron shards over both),
        within one replica group under hybrid sharding."""
        return self.dp * self.cp // self.dp_replicate

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.etp is None:  # Megatron's default (etp = tp): left out, so plans without folding read as before
            del out["etp"]
        for name in RUN_SETTINGS + PEFT_SETTINGS + ("loss_slots",):  # the engine's default: left out, as etp
            if out[name] is None:
                del out[name]
        return out

    def with_(self, **changes) -> ParallelPlan:
        return replace(self, **changes)

    def with_microbatch(self, micro_batch_size: int, grad_accum_steps: int, recompute: str,
                        recompute_modules: tuple[str, ...] | None = None) -> ParallelPlan:
        """``with_(...)`` of these four fields (modules in :data:`RECOMPUTE_MODULES` order), as the planner's inner loop
        asks for ~10^4 of them: the other fields are this (valid) plan's, so only the four are checked, and the copy
        is made without the frozen dataclass's per-field ``object.__setattr__`` (``autotune.specs.frozen``)."""
        if not (type(micro_batch_size) is int and micro_batch_size >= 1 and type(grad_accum_steps) is int
                and grad_accum_steps >= 1 and recompute in _RECOMPUTES
                and (recompute_modules is None or (recompute == "selective" and recompute_modules == tuple(
                    m for m in RECOMPUTE_MODULES if m in recompute_modules)))):
            return replace(self, micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                           recompute=recompute, recompute_modules=recompute_modules)  # reports what is wrong
        return _copy_with_microbatch(self, micro_batch_size, grad_accum_steps, recompute, recompute_modules)

    def with_sharding(self, zero_stage: int, dp_replicate: int, offload_optimizer: str, offload_param: str,
                      precision: str, fp8_recipe: str | None) -> ParallelPlan:
        """``with_(...)`` of these six fields (the planner's variants of one layout), checked as the constructor checks
        them (``__post_init__``: its checks that read them, here; every check where one fails, to report it),
        copied as ``with_microbatch`` copies."""
        new = _copy_with_sharding(self, zero_stage, dp_replicate, offload_optimizer, offload_param, precision,
                                  fp8_recipe)
        if not (zero_stage in (0, 1, 2, 3) and type(dp_replicate) is int and dp_replicate >= 1
                and self.dp % dp_replicate == 0 and offload_optimizer in _OFFLOADS and offload_param in _OFFLOADS
                and precision in _PRECISIONS
                and (fp8_recipe is None or (fp8_recipe in FP8_RECIPES and precision == "fp8"))
                and (not self.fp8_attention or precision == "fp8")
                and (not self.fp8_output_proj or (precision == "fp8" and fp8_recipe == "te-mxfp8"))):
            new.__post_init__()  # reports what is wrong
        return new


_copy_with_microbatch = copier(ParallelPlan, ("micro_batch_size", "grad_accum_steps", "recompute",
                                              "recompute_modules"))
_copy_with_sharding = copier(ParallelPlan, ("zero_stage", "dp_replicate", "offload_optimizer", "offload_param",
                                            "precision", "fp8_recipe"))
