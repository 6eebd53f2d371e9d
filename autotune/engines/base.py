"""The engine plug point: what trains a plan, and everything that depends on which one it is.

An engine answers, for a plan: which plan dimensions it can run and which rules it enforces
(:attr:`Engine.support` and :meth:`Engine.extra_problems`, worded as the engine words them, with
the source line); what model states and buffers one GPU holds (:meth:`Engine.model_states`,
:meth:`Engine.buffers`); how its communication is scheduled (:attr:`Engine.comm`); the files it
writes and how they are launched (:meth:`Engine.render_files`); the trial workload that runs it
(:attr:`Engine.workload`). Nothing outside ``autotune/engines`` tests an engine's name.

Every engine passes one contract suite: ``tests/engines/test_contract.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # typed data only; the engines import the cost model lazily
    from autotune.cost.activations import ActivationFacts
    from autotune.cost.memory import MemorySettings, ModelStateBytes
    from autotune.emit.checkpoint import CheckpointPolicy
    from autotune.emit.options import EmitOptions
    from autotune.api import Estimate
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec, ParamGroups
    from autotune.specs.plan import ParallelPlan

__all__ = ["Engine", "EngineSupport", "CommSchedule", "EngineFiles", "Rule"]


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
    precisions: tuple[str, ...] = ("bf16", "fp16", "fp8")


@dataclass(frozen=True, slots=True, kw_only=True)
class CommSchedule:
    """How an engine schedules its communication (what overlaps with compute, what is exposed)."""

    dp_overlap: str
    """Gradient reduction: "bucketed" (DeepSpeed overlap_comm / Megatron overlap-grad-reduce, hidden behind
    backward except the last bucket) or "per_layer" (FSDP2: reduce-scatter per wrapped block)."""
    param_gather: str
    """ZeRO-3 / FSDP parameter all-gathers: "prefetch" (DeepSpeed stage3_prefetch_bucket_size, one layer ahead),
    "fsdp2" (fully_shard implicit prefetch of the next block), "none"."""
    pipeline_schedule: str | None
    """"1f1b", "interleaved-1f1b" (when vpp > 1), "deepspeed-1f1b" (TrainSchedule), None without PP."""
    cp_kind: str | None
    """"ring" or "ulysses"."""
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
    tp_backward_overlap: bool = False
    """The backward's TP collective of the input gradient runs asynchronously behind the weight-gradient GEMM
    (Megatron ``LinearWithGradAccumulationAndAsyncCommunication``, ``async_op=True``)."""
    param_gather_overlap: bool = False
    """ZeRO-1/2 / distributed optimizer: the all-gather of the updated 16-bit weights after the optimizer step runs
    behind the next forward (Megatron ``--overlap-param-gather``, emitted with overlap_comm). False: it runs inside
    the optimizer step and waits (DeepSpeed ``all_gather_dp_groups`` at the end of ``step()`` in
    runtime/zero/stage_1_and_2.py and runtime/bf16_optimizer.py)."""
    elementwise_kernels: str = "fused"
    """How the model's norms, activation and RoPE run: "fused" (one kernel each: Megatron / Transformer Engine)
    or "eager" (PyTorch modules op by op: torchtitan's and transformers' RMSNorm, SwiGLU, RoPE without
    torch.compile; ``autotune.cost.layer_time.EAGER_BYTES``)."""


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


class Engine(ABC):
    """One training engine. Subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]
    """The plan's ``engine`` value."""
    title: ClassVar[str]
    version: ClassVar[str]
    """The version whose rules and defaults are modelled."""
    support: ClassVar[EngineSupport]
    comm: ClassVar[CommSchedule]
    checkpoint_format: ClassVar[str]
    """"deepspeed" (engine.save_checkpoint tags), "torch_dist" (Megatron distributed), "dcp" (torch DCP)."""
    workload: ClassVar[str]
    """The trial workload: "builtin" (``python -m autotune.train``) or "command" (needs CUDA: Megatron-LM)."""
    trainer_module: ClassVar[str | None] = None
    """The module ``python -m autotune.train`` runs for this engine's plans (its ``main(est, args, rest)``);
    None where the workload is "command" (Megatron-LM, Megatron-DeepSpeed: their own pretrain_gpt.py)."""
    trainer_takes_deepspeed_config: ClassVar[bool] = False
    """The trainer needs ``--deepspeed-config ds_config.json`` (the tuner passes the trial's)."""
    uses_deepspeed_ops: ClassVar[bool] = False
    """Its trials run DeepSpeed, which JIT-builds ops (shm_comm on CPU, cpu_adam with optimizer offload) that the
    tuner builds once before the first trial; False: no DeepSpeed in its trials, nothing to build."""

    # ---- rules -----------------------------------------------------------------------------
    def extra_problems(self, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> list[Rule]:
        """Engine rules beyond what :attr:`support` says (default: none)."""
        del model, cluster, plan
        return []

    def plan_problems(self, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> list[Rule]:
        """Every engine rule the plan breaks (the generic rules live in ``autotune.specs.rules``)."""
        from autotune.engines.support_rules import support_problems

        return support_problems(self, model, plan) + self.extra_problems(model, cluster, plan)

    # ---- memory ----------------------------------------------------------------------------
    @abstractmethod
    def model_states(self, model: ModelSpec, plan: ParallelPlan, stage: int, dense_params: float,
                     expert_params: float) -> ModelStateBytes:
        """Weights, gradients, optimizer states (GPU and host) of one GPU of ``stage``."""

    def buffers(self, model: ModelSpec, plan: ParallelPlan, groups: ParamGroups,
                settings: MemorySettings) -> dict[str, float]:
        """Engine buffers on one GPU by name (buckets, gathered parameters); default none."""
        del model, plan, groups, settings
        return {}

    def activation_facts(self, plan: ParallelPlan) -> ActivationFacts:
        """How this engine's code saves activations (``autotune.cost.activations.ActivationFacts``); default
        Megatron-LM's (attention-core selective recompute, in-place vocab-parallel cross entropy)."""
        from autotune.cost.activations import MEGATRON_FACTS

        del plan
        return MEGATRON_FACTS

    def fp8_weight_cache_bytes(self, plan: ParallelPlan, groups: ParamGroups) -> float:
        """FP8 copies of the GEMM weights kept across the step: Transformer Engine caches each weight in FP8,
        row- and column-wise (2 x 1 byte; ``transformer_engine/pytorch/module/linear.py`` weight workspaces)."""
        return 2 * groups.tp_sharded / plan.tp + 2 * groups.expert / (plan.ep * plan.tp)

    def grad_reduce_bytes(self, plan: ParallelPlan) -> float:
        """Bytes per gradient element in the data-parallel reduction (16-bit by default)."""
        del plan
        return 2.0

    def optimizer_pass_bytes(self, plan: ParallelPlan) -> float:
        """HBM bytes per local parameter that the optimizer step moves besides the fused Adam kernel: the
        gradient-norm pass of gradient clipping (on by default: Megatron ``--clip-grad 1.0``, DeepSpeed
        ``gradient_clipping``, torchtitan ``max_norm``) reads the fp32 gradients (4 B); with fp16 the loss-scale
        unscale and inf/nan check reads and writes them (8 B, ``_amp_foreach_non_finite_check_and_unscale_``);
        and the copy of the fp32 master weights into the 16-bit model weights re-reads the master (4 B; its 2 B
        write is in the Adam term; Megatron ``_copy_main_params_to_model_params``, DeepSpeed's fp16 partition)."""
        return 4.0 + 4.0 + (8.0 if plan.precision == "fp16" else 0.0)

    def grad_accumulate_bytes(self, plan: ParallelPlan) -> float:
        """HBM bytes per local parameter that accumulating one micro-batch's gradients moves outside the GEMMs
        (0: accumulated inside the weight-gradient GEMM or by the reduction itself)."""
        del plan
        return 0.0

    def saved_states_plan(self, plan: ParallelPlan) -> tuple[ParallelPlan, bool]:
        """(a plan whose model states are what one rank writes per checkpoint, whether 16-bit weights are
        written): default the plan with offload undone (where states live does not change what is saved)."""
        return plan.with_(offload_optimizer="none", offload_param="none"), True

    # ---- words -----------------------------------------------------------------------------
    @abstractmethod
    def tag(self, plan: ParallelPlan) -> str:
        """The short sharding tag of plan summaries ("ds-zero1", "mcore-distopt", "fsdp-full")."""

    @abstractmethod
    def sharding(self, plan: ParallelPlan) -> str:
        """One sentence: what the data-parallel ranks shard under this plan."""

    def fp8_how(self, plan: ParallelPlan) -> str:
        del plan
        return "Transformer Engine modules + te_fp8_recipe.fp8_autocast() in the training script"

    def fp8_param_gather(self, plan: ParallelPlan) -> bool:
        del plan
        return False

    # ---- files -----------------------------------------------------------------------------
    @abstractmethod
    def render_files(self, est: Estimate, options: EmitOptions, policy: CheckpointPolicy,
                     env: dict[str, str]) -> EngineFiles:
        """The engine's own files for the plan (launch scripts, plan.json and plan.md are added by the bundle)."""

    def __repr__(self) -> str:
        return f"<engine {self.name}>"
