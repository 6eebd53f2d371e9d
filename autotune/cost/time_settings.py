"""TimeSettings: what a step-time estimate assumes beyond the plan: the fitted efficiencies, the host's memory
bandwidth, and the run settings an engine or a published run fixes (FP8 recipe, TP overlap, selective policy,
torch.compile, DeepSpeed ZeRO-3's buckets, the attention kernel, CP's K/V width). autotune.cost.step_time reads it."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autotune.cost.kernels import DERIVED_ATTENTION_KERNELS, FP8_RECIPES
from autotune.engines.facts import SELECTIVE_POLICIES as POLICIES
from autotune.errors import require_no_problems
from autotune.specs.settings import MemorySettings

__all__ = ["TimeSettings"]

_DS_DEFAULTS = MemorySettings()  # the DeepSpeed ZeRO-3 bucket sizes autotune writes (autotune.emit.deepspeed)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeSettings:
    efficiency: Efficiency = DEFAULT_EFFICIENCY
    host_memory_bandwidth_gb_per_s_per_node: float = 200.0
    """Achievable DRAM bandwidth of a node's CPUs, which CPU Adam (memory-bound) shares."""
    fp8_recipe: str | None = None
    """FP8 scaling recipe (``autotune.cost.kernels.FP8_RECIPES``); None: the engine's default."""
    tp_overlap: str | None = None
    """"none", "userbuffers" or "async-tp"; None: the engine's default."""
    tp_backward_overlap: bool | None = None
    """The backward's TP collectives behind the weight-gradient GEMMs (``CommSchedule.tp_backward_overlap``);
    None: the engine's default."""
    pp_overlap_interleaved: bool | None = None
    """The interleaved schedule's steady-phase sends behind compute (``CommSchedule.pp_overlap_interleaved``);
    None: the engine's default."""
    selective_policy: str | None = None
    """What selective recompute reruns (``engines.facts.SELECTIVE_POLICIES``); None: the engine's own."""
    torch_compile: bool = False
    """torch.compile on (torchtitan ``--compile``): inductor fuses each elementwise chain into one kernel (the
    fused bytes of ``autotune.cost.layer_time``, not the engine's eager ones)."""
    stage3_prefetch_bucket_size: int = _DS_DEFAULTS.stage3_prefetch_bucket_size
    """DeepSpeed ZeRO-3's prefetch bucket (elements), as the DeepSpeed JSON autotune writes it
    (``autotune.cost.zero3_gathers``)."""
    stage3_max_live_parameters: int = _DS_DEFAULTS.stage3_max_live_parameters
    """DeepSpeed ZeRO-3's limit on gathered parameters (elements), as autotune writes it: no prefetch beyond it."""
    reduce_bucket_size: int = _DS_DEFAULTS.reduce_bucket_size
    """DeepSpeed's gradient reduce bucket (elements), as autotune writes it: ZeRO-3's last one waits at the end."""
    stage3_max_reuse_distance: int = 1_000_000_000
    """DeepSpeed ZeRO-3's reuse distance (elements), as autotune writes it (``autotune.emit.deepspeed``)."""
    zero3_list_collectives: bool = False
    """DeepSpeed ZeRO-3 collectives through per-rank tensor lists, before v0.5.5 (``autotune.cost.zero3_gathers``)."""
    attention_kernel: str | None = None
    """The run's fused attention kernel ("fa2", "fa3", ``kernels.DERIVED_ATTENTION_KERNELS``); None: the engine's."""
    cp_repeat_kv: bool | None = None
    """The model code repeats K and V to every query head before attention, so context parallelism exchanges and
    holds K and V at the query width (torchtitan before SDPA's ``enable_gqa``: ``repeat_kv`` in
    torchtitan/models/llama/model.py at 9dec370); None: the engine's default (``CommSchedule.cp_repeat_kv``)."""
    te_cross_entropy: bool | None = None
    """The loss is Transformer Engine's fused ``parallel_cross_entropy`` (``MemorySettings.te_cross_entropy``, the
    same run setting): its time is 10 HBM bytes a logit, not the fp32 softmax's 26 (``autotune.cost.loss_kernel``).
    None: the engine's own (an fp32 softmax)."""

    def __post_init__(self) -> None:
        problems = []
        if self.fp8_recipe is not None and self.fp8_recipe not in FP8_RECIPES:
            problems.append(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.selective_policy not in (None, *POLICIES):
            problems.append(f"selective_policy must be one of {', '.join(POLICIES)}, got {self.selective_policy!r}")
        if self.attention_kernel not in (None, "fa2", "fa3", *DERIVED_ATTENTION_KERNELS):
            problems.append(f"attention_kernel {self.attention_kernel!r} is not fa2, fa3 nor a derived kernel")
        if self.tp_overlap not in (None, "none", "userbuffers", "async-tp"):
            problems.append(f"tp_overlap must be none, userbuffers or async-tp, got {self.tp_overlap!r}")
        require_no_problems(problems, subject="time settings")
