"""NVIDIA's run settings per row of bench/data/nvidia_recipes_blackwell.csv, as `autotune estimate` flags.

bench/data/nvidia_recipe_settings.csv (written by bench/nvidia_recipe_settings_build.py from the Megatron-Bridge
release that first documents each row's container) holds, per row (its ``source``), the recipe function or workload
variant whose plan is the row's and each setting it leaves, with the file and line that sets it. ``flags_for`` turns
them into estimate flags and lists those the tool cannot express. A row without a matched recipe gets no flags (the
bench takes autotune's default settings and the fastest recompute that fits); where a release's base recipe is not
read (v0.2 / v0.3 build it from keyword arguments), the settings it leaves (recompute, TP overlap) are the tool's
default or, for the recompute, the fastest that fits.

The Megatron meaning of each setting read here (megatron-core ``transformer_config.py``, Megatron-Bridge
``training/comm_overlap.py``):
- ``recompute_granularity`` None / "selective" / "full"; with selective, ``recompute_modules`` (None: Megatron's
  default ["core_attn"]); with full, ``recompute_num_layers``;
- ``cuda_graph_impl`` "none" / "local" / "transformer_engine" / "full_iteration", ``cuda_graph_scope`` the captured
  parts ("full_iteration" in the scope promotes the impl to a whole-iteration graph: Megatron-Bridge
  perf_recipes/_common.py ``_benchmark_common``; ``--cuda-graph full-iteration``);
- ``comm_overlap.tp_comm_overlap`` (userbuffers, with sequence parallelism, where tp > 1);
- ``comm_overlap.overlap_moe_expert_parallel_comm`` and ``delay_wgrad_compute``;
- ``cpu_offloading`` with ``cpu_offloading_num_layers`` N: the first N layers' saved activations offloaded to host
  memory (``--activation-offload-layers N``); Megatron-core refuses it with any recompute (transformer_config.py:
  1896-1899 at d98e8a6), so a recipe that offloads and whose recompute is not read ran without one;
- ``mixed_precision.fp8_dot_product_attention`` True: FP8 attention (``--fp8-attention``); where the recipe sets it
  from a parameter of a shared helper (the value is the parameter's name), the value its caller passes
  (``FP8_DPA_PASSED``);
- ``model.fp8_output_proj`` True: the output layer in MXFP8 (``--fp8-output-proj``, Megatron-core fp8_output_proj,
  core 0.18+); a shared helper's parameter as its caller passes it (``FP8_OUTPUT_PROJ_PASSED``).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from autotune.emit.megatron_layout import expanded_layout
from autotune.specs.plan import CUDA_GRAPH_SCOPES, RECOMPUTE_MODULES

DATA = Path(__file__).resolve().parent / "data" / "nvidia_recipe_settings.csv"

NOT_EXPRESSIBLE = {
    "moe_router_force_load_balancing": ("True",),
    "pipeline_model_parallel_layout": None,  # any value but None
    "account_for_embedding_in_pipeline_split": ("True",),
    "account_for_loss_in_pipeline_split": ("True",),
    "fine_grained_activation_offloading": ("True",),
    "overlap_param_gather_with_optimizer_step": ("True",),
    "moe_paged_stash": ("True",),
    "use_transformer_engine_op_fuser": ("True",),
    "moe_shared_expert_overlap": ("True",),
}
"""Settings the recipes turn on that `autotune estimate` has no flag for (value None: any value other than None)."""
SYNC_FREE_MOE_SETTINGS = ("moe_paged_stash", "use_transformer_engine_op_fuser")
"""Of those, the ones the tool writes itself with MoE under a full-iteration graph on HybridEP."""
FP8_DPA_PASSED = {
    # perf_recipes/deepseek/common.py:49-75 at 51885cf: _enable_deepseek_full_iteration_mxfp8(cfg, *,
    # fp8_dot_product_attention=False, ...) sets cfg.mixed_precision.fp8_dot_product_attention to its parameter
    "deepseek_v3_pretrain_256gpu_gb300_fp8mx_config": "True",  # gb300/deepseek_v3.py:157 passes True
    "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config": "False",  # gb200/deepseek_v3.py:160 passes none: the default
}
"""Recipe -> the ``fp8_dot_product_attention`` its call of the shared helper passes (NVIDIA-NeMo/Megatron-Bridge@
51885cf132b2 src/megatron/bridge/perf_recipes/deepseek/)."""
FP8_OUTPUT_PROJ_PASSED = {
    # perf_recipes/deepseek/common.py:50-71 at 51885cf: _enable_deepseek_full_iteration_mxfp8(cfg, *, ...,
    # fp8_output_proj=False) sets cfg.model.fp8_output_proj to its parameter
    "deepseek_v3_pretrain_256gpu_gb300_fp8mx_config": "True",  # gb300/deepseek_v3.py:157 passes True
    "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config": "True",  # gb200/deepseek_v3.py:160 passes True
}
"""Recipe -> the ``fp8_output_proj`` its call of the shared helper passes (NVIDIA-NeMo/Megatron-Bridge@51885cf132b2
src/megatron/bridge/perf_recipes/deepseek/)."""
FP8_SWITCHES = {"fp8_dot_product_attention": (FP8_DPA_PASSED, "--fp8-attention", "FP8 attention"),
                "fp8_output_proj": (FP8_OUTPUT_PROJ_PASSED, "--fp8-output-proj", "MXFP8 output layer")}
"""Recipe settings that switch a part to FP8: (the values the shared helper's callers pass, the flag, its label)."""


@dataclass
class RecipeSettings:
    recipe: str = ""
    read_at: str = ""  # the release tag the settings were read at
    unmatched: str = ""
    values: dict[str, tuple[str, str]] = field(default_factory=dict)  # short name -> (value, where)

    def get(self, name: str) -> str | None:
        v = self.values.get(name, ("None", ""))[0]
        return None if v in ("None", "") else v


def load_settings(path: Path = DATA) -> dict[str, RecipeSettings]:
    """Row source -> its recipe's settings (last part of each dotted name)."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]
    out: dict[str, RecipeSettings] = defaultdict(RecipeSettings)
    for r in csv.DictReader(lines):
        s = out[r["source"]]
        s.recipe, s.unmatched, s.read_at = r["recipe"], r["unmatched"], r["read_at"]
        if r["setting"]:
            s.values[r["setting"].rsplit(".", 1)[-1]] = (r["value"], r["where"])
    return dict(out)


@dataclass
class Flags:
    argv: list[str] = field(default_factory=list)
    recompute_set: bool = False  # the recipe's recompute was read (else the bench tries each mode)
    applied: list[str] = field(default_factory=list)  # settings passed as flags
    unexpressed: list[str] = field(default_factory=list)  # settings on that the tool cannot express


def without_graphs(f: Flags) -> Flags:
    """The flags less the CUDA-graph ones (where the tool refuses the recipe's graphs with its other settings)."""
    argv, skip = [], False
    for a in f.argv:
        skip = a.startswith("--cuda-graph") or (skip and not a.startswith("--"))
        if not skip:
            argv.append(a)
    return Flags(argv=argv, recompute_set=f.recompute_set,
                 applied=[a for a in f.applied if not a.startswith("CUDA graphs")],
                 unexpressed=[*f.unexpressed, "CUDA graphs (refused with the other settings)"])


def flags_for(s: RecipeSettings | None, tp: int, ep: int, split_accounts: bool = False,
              split_layout: str | None = None) -> Flags:
    """Estimate flags of a matched recipe's settings (none for an unmatched row). ``split_accounts``: the tool's own
    pipeline split of the plan is Megatron's account-for-embedding-and-loss one (``emit.megatron_layout``), which
    the recipe's account_for_* flags then ask for without a flag; ``split_layout``: the layout string the tool
    writes for the plan, where it writes one: a recipe layout that spells the same stages is expressed (NVIDIA's
    DeepSeek-V3 layouts, which the tool's split with the MTP module reproduces)."""
    f = Flags()
    if s is None or not s.recipe:
        return f
    gran = s.get("recompute_granularity")
    f.recompute_set = "recompute_granularity" in s.values  # else the bench tries each mode (the fallback)
    offloaded = s.get("cpu_offloading_num_layers") if s.get("cpu_offloading") == "True" else None
    if offloaded and not f.recompute_set:
        # Megatron-core refuses CPU offload with any recompute (transformer_config.py:1896-1899 at d98e8a6): a recipe
        # that offloads ran without one, whatever its unread base recipe says.
        f.recompute_set, gran = True, None
    if not f.recompute_set:
        f.unexpressed.append("recompute not read (the release's base recipe is not flat)")
    elif gran is None:
        f.argv += ["--recompute", "none"]
    elif gran == "selective":
        f.argv += ["--recompute", "selective"]
        modules = (s.get("recompute_modules") or "core_attn").split()
        known = [m for m in modules if m in RECOMPUTE_MODULES]
        f.argv += ["--recompute-modules", *(known or ["core_attn"])]
        f.unexpressed += [f"recompute module {m}" for m in modules if m not in RECOMPUTE_MODULES]
    else:
        f.argv += ["--recompute", "full"]
        if s.get("recompute_num_layers"):
            f.argv += ["--recompute-num-layers", s.get("recompute_num_layers")]
    if f.recompute_set:
        f.applied.append(f"recompute {gran or 'none'}")
    if offloaded:  # Megatron --cpu-offloading-num-layers (Bridge's model.cpu_offloading with _num_layers)
        f.argv += ["--activation-offload-layers", offloaded]
        f.applied.append(f"activation offload {offloaded} layers")
    impl, scope = s.get("cuda_graph_impl"), (s.get("cuda_graph_scope") or "").split()
    if impl == "full_iteration" or "full_iteration" in scope:
        # A whole-iteration graph (forward, backward and the pipeline's sends; Megatron's FullCudaGraphWrapper)
        f.argv += ["--cuda-graph", "full-iteration"]
        f.applied.append("CUDA graphs full-iteration")
    elif impl in ("local", "transformer_engine"):
        f.argv += ["--cuda-graph", impl]
        parts = [p for p in scope if p in CUDA_GRAPH_SCOPES]
        if parts:
            f.argv += ["--cuda-graph-scope", *parts]
        f.unexpressed += [f"CUDA graph scope {p}" for p in scope if p not in CUDA_GRAPH_SCOPES and p != "full"]
        f.applied.append(f"CUDA graphs {impl}")
    elif "cuda_graph_impl" in s.values:
        f.argv += ["--cuda-graph", "none"]
    if tp > 1 and "tp_comm_overlap" in s.values:
        on = s.get("tp_comm_overlap") == "True"
        f.argv += ["--tp-overlap", "userbuffers" if on else "none"]
        f.applied.append(f"TP overlap {'userbuffers' if on else 'none'}")
    if ep > 1:
        on = s.get("overlap_moe_expert_parallel_comm") == "True"
        mode = ("a2a-delay-wgrad" if s.get("delay_wgrad_compute") == "True" else "a2a") if on else "none"
        f.argv += ["--ep-overlap", mode]
        f.applied.append(f"EP overlap {mode}")
    dispatcher = s.get("moe_token_dispatcher_type")
    if ep > 1 and dispatcher in ("alltoall", "allgather", "flex"):
        # Megatron-core's flex dispatcher runs DeepEP unless told HybridEP (--moe-flex-dispatcher-backend's default,
        # megatron/training/arguments.py of core_v0.19.0)
        value = f"flex-{s.get('moe_flex_dispatcher_backend') or 'deepep'}" if dispatcher == "flex" else dispatcher
        f.argv += ["--moe-dispatcher", value]
        f.applied.append(f"MoE dispatcher {value}")
    for name, (passed, flag, label) in FP8_SWITCHES.items():
        value = s.get(name)
        if value == name:  # a shared helper's parameter: what the recipe's call passes
            value = passed.get(s.recipe, value)
        if value == "True":
            f.argv.append(flag)
            f.applied.append(label)
        elif value not in (None, "False"):
            f.unexpressed.append(f"{name}={value} (the value its caller passes is not read)")
    # The sync-free MoE path of a whole-iteration graph: the tool writes the paged stash and the op fuser with it
    # (autotune.specs.sync_free_moe), at Bridge's values of the rank budget (which may differ from the recipe's)
    sync_free = "--cuda-graph" in f.argv and "full-iteration" in f.argv and "flex-hybridep" in f.argv
    for name, values in NOT_EXPRESSIBLE.items():
        v = s.get(name)
        if split_accounts and name.startswith("account_for_"):
            continue
        if name == "pipeline_model_parallel_layout" and v is not None and split_layout is not None \
                and expanded_layout(v) == expanded_layout(split_layout):
            continue
        if sync_free and name in SYNC_FREE_MOE_SETTINGS:
            continue
        if v is not None and (values is None or v in values):
            f.unexpressed.append(f"{name}={v}")
    return f


def settings_table(cases: list) -> None:
    """How many estimated rows ran with their recipe's settings (all expressible / some not), and the count of
    each setting the tool could not express."""
    full = [c for c in cases if c.flags.argv and not c.flags.unexpressed]
    partial = [c for c in cases if c.flags.argv and c.flags.unexpressed]
    none = [c for c in cases if not c.flags.argv]
    print(f"\nRECIPE SETTINGS of the {len(cases)} estimated rows: {len(full)} with every setting expressed, "
          f"{len(partial)} partly (settings below not expressible), {len(none)} with default settings "
          f"(no recipe of the release documenting the row's container runs its plan, the recipe sets nothing the "
          f"tool reads, or the tool refused a setting)")
    missing: dict[str, int] = defaultdict(int)
    for c in partial:
        for what in c.flags.unexpressed:
            missing[what] += 1
    for what, n in sorted(missing.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:>4}  {what}")
