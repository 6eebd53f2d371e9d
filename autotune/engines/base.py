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
from typing import TYPE_CHECKING, ClassVar

from autotune.emit.precision import DEFAULT_FP8_HOW
from autotune.engines.facts import EXPERT_OUTPUT_SAVING_FACTS, ActivationFacts, CommSchedule, EngineFiles, EngineSupport, Rule
from autotune.engines.support_rules import support_problems
from autotune.specs.engine_versions import EngineVersions
from autotune.specs.layout import split_scheme
from autotune.specs.nvfp4 import FP4_PRECISION, NVFP4_WEIGHT_BYTES
from autotune.specs.plan import FP8_BLOCK_SCALE_BYTES

PER_TENSOR_TE_RECIPES = ("te-delayed", "te-current")
"""Transformer Engine's per-tensor-scaled FP8 recipes (Float8Tensor: one scale, so the row-wise data transposed is
the column-wise copy); the block-scaled ones (te-mxfp8, te-blockwise) scale each direction apart."""

if TYPE_CHECKING:  # typed data only: specs, the run's settings and the file formats beneath the engines
    from autotune.emit.checkpoint import CheckpointSettings
    from autotune.emit.options import EmitOptions
    from autotune.engines.states import ModelStateBytes
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec, ParamGroups
    from autotune.specs.plan import ParallelPlan
    from autotune.specs.settings import MemorySettings

__all__ = ["Engine"]


class Engine(ABC):
    """One training engine. Subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]
    """The plan's ``engine`` value."""
    title: ClassVar[str]
    version: ClassVar[str]
    """The versions whose rules and defaults are modelled, in words."""
    versions: ClassVar[EngineVersions]
    """The releases modelled, as data (``autotune.specs.engine_versions``): which package, which releases (the newest
    last, the default where the package is not installed), and companion packages."""
    support: ClassVar[EngineSupport]
    comm: ClassVar[CommSchedule]
    checkpoint_format: ClassVar[str]
    """"deepspeed" (engine.save_checkpoint tags), "torch_dist" (Megatron distributed), "dcp" (torch DCP)."""
    workload: ClassVar[str]
    """The trial workload: "builtin" (``python -m autotune.train``) or "command" (needs CUDA: Megatron-LM)."""
    checkpoint_tiers: ClassVar[tuple[str, ...]] = ("shared",)
    """Checkpoint storage tiers its files can use (autotune.cost.checkpoint_tiers): "shared" (a parallel file
    system), "local" (node-local storage with a replica on a peer node)."""
    consolidates_weights_at_save: ClassVar[bool] = False
    """Every periodic save also writes the whole 16-bit model from rank 0 (the Hugging Face Trainer's ``save_model``
    at each ``save_steps``), beside the engine's sharded checkpoint (autotune.cost.checkpoint)."""
    expandable_segments: ClassVar[bool] = False
    """The engine's own launcher runs PyTorch's allocator with expandable segments (``MemorySettings.
    expandable_segments`` None takes this; the emitted launch scripts then export it): the ledger's fit leaves the
    allocator's reserve out (``autotune.cost.memory``)."""
    trainer_saves: ClassVar[bool] = False
    """The built-in trainer saves and resumes checkpoints as the bundle's policy says (autotune/train/checkpointing)."""
    trainer_module: ClassVar[str | None] = None
    """The module ``python -m autotune.train`` runs for this engine's plans (its ``main(est, args, rest)``);
    None where the workload is "command" (Megatron-LM, Megatron-DeepSpeed: their own pretrain_gpt.py)."""
    trainer_takes_deepspeed_config: ClassVar[bool] = False
    """The trainer needs ``--deepspeed-config ds_config.json`` (the tuner passes the trial's)."""
    accelerate_distributed_type: ClassVar[str | None] = None
    """The ``distributed_type`` of the accelerate config its plans run from ("DEEPSPEED": the DeepSpeed plugin and
    its JSON; "FSDP": the FSDP2 plugin, no batch sizes in it); None: accelerate runs none (tune's
    ``{accelerate_config}`` cannot carry them)."""
    torchtitan_jobs: ClassVar[bool] = False
    """Its plans are torchtitan jobs (tune's ``{torchtitan_config}`` can carry them)."""
    uses_deepspeed_ops: ClassVar[bool] = False
    """Its trials run DeepSpeed, which JIT-builds ops (shm_comm on CPU, cpu_adam with optimizer offload) that the
    tuner builds once before the first trial; False: no DeepSpeed in its trials, nothing to build."""
    logged_flops: ClassVar[str | None] = None
    """Whose FLOP count the engine's training loop logs as TFLOP/s per GPU, where the tool reproduces it
    ("megatron-bridge": autotune.cost.logged_flops); None where it does not."""

    # ---- rules -----------------------------------------------------------------------------
    def release_problems(self, release: str, model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
        """Rules of one release of the engine's package (``versions``), beyond :meth:`plan_problems` (which hold for
        every release): what the files written for ``release`` cannot run. The search asks it of each layout where
        the release is named (``SearchConstraints.engine_versions``), ``estimate`` of its plan (default: none)."""
        del release, model, plan
        return []

    def builtin_trainer_problem(self, model: ModelSpec, plan: ParallelPlan) -> str | None:
        """Why the built-in trainer (:attr:`trainer_module`) cannot run a plan the engine itself runs (None when it
        can, or the engine has none): the launch scripts' default program; the user's own script (``emit
        --script``) or the engine's own config is then the way (autotune.engines.builtin_trainer)."""
        del model, plan
        return None

    def extra_problems(self, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> list[Rule]:
        """Engine rules beyond what :attr:`support` says (default: none)."""
        del model, cluster, plan
        return []

    def plan_problems(self, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> list[Rule]:
        """Every engine rule the plan breaks: what :attr:`support` refuses (``autotune.engines.support_rules``)
        and :meth:`extra_problems` (the generic rules live in ``autotune.rules``)."""
        return support_problems(self, model, plan) + self.extra_problems(model, cluster, plan)

    # ---- memory ----------------------------------------------------------------------------
    @abstractmethod
    def model_states(self, model: ModelSpec, plan: ParallelPlan, stage: int, dense_params: float,
                     expert_params: float) -> ModelStateBytes:
        """Weights, gradients, optimizer states (GPU and host) of one GPU of ``stage``."""

    def buffers(self, model: ModelSpec, plan: ParallelPlan, groups: ParamGroups,
                settings: MemorySettings, fp8_any_layout: bool = False, stage: int = 0) -> dict[str, float]:
        """Engine buffers on one GPU by name (buckets, gathered parameters); default none. ``fp8_any_layout``: the
        GPU's FP8 GEMMs take either layout (``GPUSpec.fp8_gemm_any_layout``; see :meth:`fp8_copies`); ``stage``: the
        pipeline stage whose parameters ``groups`` are (the first holds the embedding, the last the output layer)."""
        del model, plan, groups, settings, fp8_any_layout, stage
        return {}

    def activation_facts(self, plan: ParallelPlan) -> ActivationFacts:
        """How this engine's code saves activations (:class:`ActivationFacts`); default Megatron-LM's
        (attention-core selective recompute, in-place vocab-parallel cross entropy) with an MoE combine that keeps
        the expert outputs (DeepSpeed-MoE, Hugging Face MoE blocks); the Megatron engine's own is ``MEGATRON_FACTS``."""
        del plan
        return EXPERT_OUTPUT_SAVING_FACTS

    def fp8_weight_cache_bytes(self, plan: ParallelPlan, groups: ParamGroups, any_layout: bool = False) -> float:
        """FP8 copies of the GEMM weights kept across the step: Transformer Engine caches each weight in FP8,
        row- and column-wise (2 x 1 byte; ``transformer_engine/pytorch/module/linear.py`` weight workspaces), each
        with its block scales under a block-scaled recipe (:meth:`fp8_weight_bytes`). ``any_layout``
        (``GPUSpec.fp8_gemm_any_layout``, Blackwell): a per-tensor-scaled weight's one FP8 copy serves both uses
        (:meth:`fp8_copies`)."""
        return self.fp8_copies(plan, any_layout) * self.fp8_weight_bytes(plan) * (
            groups.tp_sharded / plan.tp + groups.expert / (plan.ep * plan.tp))

    def fp8_copies(self, plan: ParallelPlan, any_layout: bool) -> int:
        """FP8 copies Transformer Engine keeps of one weight: the row-wise data and the column-wise one (the
        transpose for per-tensor scaling, the other scaling direction for MXFP8 / blockwise). On a GPU whose FP8
        GEMMs take either layout a per-tensor-scaled tensor (te-delayed, te-current) holds only its data
        (TE d0067d0 csrc/quantizer.cpp: ``with_data = rowwise_usage || is_non_tn_fp8_gemm_supported``,
        ``with_transpose = columnwise_usage && !is_non_tn_fp8_gemm_supported``)."""
        if plan.precision == FP4_PRECISION:  # is_non_tn_fp8_gemm_supported is FP8's: NVFP4 keeps both directions
            return 2
        per_tensor = (plan.fp8_recipe or self.comm.fp8_recipe) in PER_TENSOR_TE_RECIPES
        return 1 if any_layout and per_tensor else 2

    def fp8_weight_bytes(self, plan: ParallelPlan) -> float:
        """Bytes per element of one FP8 copy of a weight: 1, plus its scales under a block-scaled recipe
        (``autotune.specs.plan.FP8_BLOCK_SCALE_BYTES``: 1/32 B with MXFP8, 4 B per 128 x 128 block with blockwise);
        of an NVFP4 copy, half a byte and a 1-byte scale per 16 x 16 block (``NVFP4_WEIGHT_BYTES``)."""
        if plan.precision == FP4_PRECISION:
            return NVFP4_WEIGHT_BYTES
        return 1.0 + FP8_BLOCK_SCALE_BYTES.get(plan.fp8_recipe or self.comm.fp8_recipe, (0.0, 0.0))[1]

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

    def compiles(self, plan: ParallelPlan) -> bool:
        """Whether the files this engine writes for ``plan`` run it under torch.compile (its memory-bound kernels
        then fused, ``autotune.cost.layer_time.elementwise_kernels``). The cost model asks this, not a default.
        Default: as the plan says (``ParallelPlan.torch_compile``; the support rules refuse it where the engine's
        files cannot turn compile on)."""
        return bool(plan.torch_compile)

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
        return DEFAULT_FP8_HOW

    def layer_split_of(self, plan: ParallelPlan, num_layers: int) -> str:
        """How this engine splits ``plan``'s ``num_layers`` layers over its pipeline stages: ``support.layer_split``,
        with the plan's multi-token-prediction modules counted on the last stage where they can be, and the
        output layer and loss as the plan's ``loss_slots`` slots where the engine takes them
        (``autotune.specs.layout.split_scheme``)."""
        return split_scheme(self.support.layer_split, plan.mtp_layers, num_layers, plan.pp, plan.vpp,
                            plan.loss_slots if self.support.loss_slots else None)

    @property
    def default_zero_stage(self) -> int:
        """The ZeRO stage of a plan that names none: 1 where the engine has it (DeepSpeed ZeRO-1, Megatron's
        distributed optimizer), else its deepest sharding (FSDP2: 3, fully_shard's default
        reshard_after_forward=True, torchtitan's default data_parallel_shard_degree=-1)."""
        stages = self.support.zero_stages
        return 1 if 1 in stages else max(stages)

    def release_defaults(self, release: str, model=None) -> dict[str, object]:
        """The run settings (``ParallelPlan.RUN_SETTINGS``) a release of the engine uses unless told otherwise, where
        they differ from the engine's modelled default: the command line fills them into a plan it builds for that
        release, so its estimate is the estimate of the files written for it. ``fp8_recipe`` applies to FP8
        plans only. ``model`` (a ModelSpec, or None: any model): the one the plan trains, where a default depends
        on it."""
        del release, model
        return {}

    def searched_recompute_modules(self, model: ModelSpec, precision: str,
                                   fp8_recipe: str | None) -> tuple[tuple[str, ...], ...]:
        """The module sets (``ParallelPlan.recompute_modules``) the planner searches as selective recompute modes of
        ``model``'s plans at ``precision`` / ``fp8_recipe`` (None: the engine's), beside the engine's default set;
        each one the engine's rules accept for such a plan. None here: an engine searches only its default."""
        del model, precision, fp8_recipe
        return ()

    def release_cost_settings(self, release: str) -> dict[str, object]:
        """What a release's code does that no plan field says and the cost model must know: fields of
        ``MemorySettings`` / ``TimeSettings`` (``selective_policy``: what its selective recompute keeps). The command
        line passes them with a plan it builds for that release, and ``--from`` with a file of that release."""
        del release
        return {}

    def release_written(self, options: EmitOptions) -> str:
        """The release of the engine's package its files are written for (plan.json records it): the emit option
        of an engine whose file format or flag table differs by release, else the one modelled."""
        del options
        return self.versions.newest

    def fp8_param_gather(self, plan: ParallelPlan) -> bool:
        del plan
        return False

    # ---- files -----------------------------------------------------------------------------
    @abstractmethod
    def render_files(self, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions,
                     checkpoint: CheckpointSettings, env: dict[str, str]) -> EngineFiles:
        """The engine's own files for the plan, written through the format writers of ``autotune.emit`` (launch
        scripts, plan.json and plan.md are added by the bundle)."""

    def __repr__(self) -> str:
        return f"<engine {self.name}>"
