"""Mixed-precision settings: the one place the bf16 / fp16 / fp8 choices are made.

Megatron-LM takes them as flags (:func:`megatron_precision_flags`); DeepSpeed has no FP8 key (its config
has ``fp16`` and ``bf16`` blocks only, ``deepspeed/runtime/precision_config.py``: FP8 comes from Transformer
Engine modules plus ``fp8_autocast`` in user code), so for DeepSpeed users we write a small module,
``te_fp8_recipe.py`` (:func:`te_fp8_recipe_snippet`), that builds the same recipe. What the engine does with
FP8 (whether it gathers FP8 parameters, how the model gets FP8 GEMMs) is the engine's to say: the callers
pass its words in.
"""

from __future__ import annotations

from autotune.errors import InputError
from autotune.specs.notation import plan_notation
from autotune.specs.nvfp4 import FP4_PRECISION, NVFP4_BLOCK
from autotune.specs.plan import ParallelPlan

__all__ = [
    "FP8_FORMAT", "FP8_RECIPE", "FP8_AMAX_HISTORY_LEN", "FP8_AMAX_COMPUTE_ALGO",
    "FP16_INITIAL_LOSS_SCALE", "FP16_MIN_LOSS_SCALE", "FP16_LOSS_SCALE_WINDOW", "FP16_HYSTERESIS",
    "megatron_precision_flags", "precision_summary", "fp8_format", "te_fp8_recipe_snippet", "DEFAULT_FP8_HOW",
    "is_te_recipe", "FP4_FORMAT", "FP4_RECIPE",
]

# FP8 delayed scaling as NVIDIA's reference FP8 pretraining runs set it (Megatron-LM
# examples/llama/train_llama3_8b_h100_fp8.sh: --fp8-format hybrid --fp8-amax-history-len 1024
# --fp8-amax-compute-algo max). HYBRID = E4M3 in the forward pass, E5M2 for gradients.
FP8_FORMAT = "hybrid"
FP8_RECIPE = "delayed"
# The plan's Transformer Engine recipes (ParallelPlan.fp8_recipe) as Megatron-core names them (--fp8-recipe choices
# tensorwise, delayed, mxfp8, blockwise, custom in megatron/training/arguments.py; "tensorwise" is TE's
# Float8CurrentScaling, "blockwise" Float8BlockScaling, "mxfp8" MXFP8BlockScaling: megatron/core/fp8_utils.py
# get_fp8_recipe in megatron-core 0.19.2).
MEGATRON_FP8_RECIPES = {"te-delayed": "delayed", "te-current": "tensorwise", "te-blockwise": "blockwise",
                        "te-mxfp8": "mxfp8"}
FP8_AMAX_HISTORY_LEN = 1024


def fp8_format(recipe: str | None) -> str:
    """The --fp8-format of a recipe: MXFP8 runs E4M3 for gradients too (TransformerEngine common/recipe/__init__.py
    MXFP8BlockScaling ``fp8_format = Format.E4M3``; Megatron-Bridge 0.6.2 bf16_with_mxfp8_mixed ``fp8 = "e4m3"``;
    torchao's MX linear casts inputs, weights and gradients to float8_e4m3fn: v0.18.0 prototype/moe_training/
    mxfp8_linear.py:61-63), the others HYBRID."""
    return "e4m3" if recipe in ("te-mxfp8", "torchao-mxfp8") else FP8_FORMAT

FP8_AMAX_COMPUTE_ALGO = "max"

# NVFP4 (autotune.specs.nvfp4) as Megatron-LM spells it: --fp4-format e2m1 (its only choice) --fp4-recipe nvfp4
# (Transformer Engine NVFP4BlockScaling; megatron/core/fp4_utils.py get_fp4_recipe), in every modelled release's
# flag table (emit/megatron_flags_core_v0.*.json).
FP4_FORMAT = "e2m1"
FP4_RECIPE = "nvfp4"

# Dynamic fp16 loss scaling. Start at 2**16 (DeepSpeed's initial_scale_power 16) rather than
# Megatron's 2**32 default, which skips ~16 overflowing steps before it settles; window,
# hysteresis and minimum are Megatron's (and DeepSpeed's) defaults.
FP16_INITIAL_LOSS_SCALE = 2.0**16
FP16_MIN_LOSS_SCALE = 1.0
FP16_LOSS_SCALE_WINDOW = 1000
FP16_HYSTERESIS = 2


def _fmt(x: float) -> str:
    """A number as Megatron's argparse reads it: integers without a trailing ``.0``."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def megatron_precision_flags(plan: ParallelPlan, *, fp8_param_gather: bool = False) -> list[str]:
    """Megatron-LM precision flags for the plan.

    FP8 runs keep bf16 parameters and activations outside the FP8 GEMMs, hence ``--bf16`` too.
    ``fp8_param_gather``: write ``--fp8-param-gather`` (all-gather parameters in FP8), which needs the
    distributed optimizer (validate_args 1097): the engine decides (``MegatronEngine.fp8_param_gather``).
    """
    if plan.precision == "bf16":
        return ["--bf16"]
    if plan.precision == "fp16":
        return ["--fp16", "--initial-loss-scale", _fmt(FP16_INITIAL_LOSS_SCALE),
                "--min-loss-scale", _fmt(FP16_MIN_LOSS_SCALE), "--loss-scale-window", _fmt(FP16_LOSS_SCALE_WINDOW),
                "--hysteresis", str(FP16_HYSTERESIS)]
    if plan.precision == FP4_PRECISION:  # NVFP4; --fp4-param-gather keeps the weights in NVFP4 (fp8_model_init
        # with the NVFP4 recipe, fp4_utils.py get_fp4_context) and gathers them so, as Megatron-Bridge's
        # bf16_with_nvfp4_mixed sets it (fp4_param_gather = True)
        return ["--bf16", "--fp4-format", FP4_FORMAT, "--fp4-recipe", FP4_RECIPE] + (
            ["--fp4-param-gather"] if fp8_param_gather else [])
    recipe = MEGATRON_FP8_RECIPES[plan.fp8_recipe or "te-delayed"]
    flags = ["--bf16", "--fp8-format", fp8_format(plan.fp8_recipe), "--fp8-recipe", recipe]
    if recipe == "delayed":  # the amax history is delayed scaling's; current scaling takes each tensor's own amax
        flags += ["--fp8-amax-history-len", str(FP8_AMAX_HISTORY_LEN), "--fp8-amax-compute-algo", FP8_AMAX_COMPUTE_ALGO]
    if fp8_param_gather:
        flags.append("--fp8-param-gather")
        if recipe == "mxfp8":  # the MXFP8 weights' all-gather through the gradient buffer, as Megatron-Bridge's
            # bf16_with_mxfp8_mixed sets it (and its ConfigContainer.validate requires with FP8 parameters)
            flags.append("--reuse-grad-buf-for-mxfp8-param-ag")
    if plan.fp8_output_proj:  # the LM head in MXFP8: Megatron-LM's flag for TransformerConfig.fp8_output_proj (core
        # 0.18+, NVIDIA/Megatron-LM 3f6a2ed844; megatron_flags_core_v0.18.json); the plan holds it with mxfp8 alone
        flags.append("--fp8-output-proj")
    return flags


def is_te_recipe(recipe: str) -> bool:
    """Whether an FP8 recipe (``FP8_RECIPES``) is a Transformer Engine one (te-*), the only kind
    ``te_fp8_recipe.py`` builds; the torchao-* recipes are torchao's Float8 / MX linears, no TE module."""
    return recipe.startswith("te-")


DEFAULT_FP8_HOW = "Transformer Engine modules + te_fp8_recipe.fp8_autocast() in the training script"


def precision_summary(plan: ParallelPlan, *, fp8_param_gather: bool = False, fp8_how: str = DEFAULT_FP8_HOW,
                      fp8_recipe: str = "te-delayed") -> dict:
    """The precision settings chosen for the plan, as plain data (for plan.md and ``--json``); ``fp8_param_gather``,
    ``fp8_how`` and ``fp8_recipe`` (the plan's, else the engine's default) are the engine's
    (``Engine.fp8_param_gather``, ``Engine.fp8_how``, ``Engine.comm``)."""
    fp8 = plan.precision == "fp8"
    out: dict = {
        "precision": plan.precision,
        "params_dtype": "fp16" if plan.precision == "fp16" else "bf16",
        "gemm_dtype": "fp8" if fp8 else plan.precision,  # fp4: NVFP4 (E2M1 in 16-value blocks)
        "master_weights_dtype": "fp32",
        "optimizer_states_dtype": "fp32",
        "loss_scaling": None,
        "fp8": None,
    }
    if plan.precision == "fp16":
        out["loss_scaling"] = {"dynamic": True, "initial": FP16_INITIAL_LOSS_SCALE, "min": FP16_MIN_LOSS_SCALE,
                               "window": FP16_LOSS_SCALE_WINDOW, "hysteresis": FP16_HYSTERESIS}
    if plan.precision == FP4_PRECISION:
        out["fp4"] = {"format": FP4_FORMAT, "recipe": FP4_RECIPE, "param_gather": fp8_param_gather,
                      "block": NVFP4_BLOCK, "weight_scaling": "2-D 16 x 16 blocks",
                      "hadamard_transform": "weight-gradient inputs and gradients",
                      "stochastic_rounding": "gradients"}
    if fp8:
        out["fp8"] = {"format": fp8_format(fp8_recipe), "forward": "e4m3",
                      "backward": "e4m3" if fp8_format(fp8_recipe) == "e4m3" else "e5m2", "recipe": fp8_recipe,
                      "param_gather": fp8_param_gather, "how": fp8_how}
        if fp8_recipe == "te-delayed":
            out["fp8"] |= {"amax_history_len": FP8_AMAX_HISTORY_LEN, "amax_compute_algo": FP8_AMAX_COMPUTE_ALGO}
    return out


_SNIPPET = '''"""FP8 recipe for NVIDIA Transformer Engine, written by autotune for plan: {summary}.

DeepSpeed has no FP8 config key: FP8 comes from Transformer Engine layers (te.Linear,
te.LayerNormMLP, te.TransformerLayer...) run under fp8_autocast. Use it in the training step:

    from te_fp8_recipe import fp8_recipe, fp8_autocast

    with fp8_autocast():
        loss = model_engine(batch)
    model_engine.backward(loss)

Transformer Engine is imported lazily: this file imports without it, and fp8_recipe() /
fp8_autocast() raise an ImportError saying what to install.
"""

RECIPE = "{recipe_class}"  # the transformer_engine.common.recipe class of autotune's {recipe_name}
FP8_FORMAT = "{format_upper}"  # HYBRID: E4M3 forward, E5M2 gradients; E4M3: both
AMAX_HISTORY_LEN = {history}  # DelayedScaling only
AMAX_COMPUTE_ALGO = "{algo}"  # DelayedScaling only

__all__ = ["fp8_recipe", "fp8_autocast", "RECIPE", "FP8_FORMAT", "AMAX_HISTORY_LEN", "AMAX_COMPUTE_ALGO"]


def _transformer_engine():
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe
    except ImportError as err:
        raise ImportError(
            "te_fp8_recipe needs NVIDIA Transformer Engine: pip install 'transformer-engine[pytorch]' "
            "(FP8 GEMMs also need an FP8-capable GPU: Hopper, Ada or Blackwell)"
        ) from err
    return te, recipe


def fp8_recipe():
    """The {recipe_class} recipe autotune planned for."""
    _, recipe = _transformer_engine()
    kwargs = {{"fp8_format": getattr(recipe.Format, FP8_FORMAT)}}
    if RECIPE == "DelayedScaling":
        kwargs.update(amax_history_len=AMAX_HISTORY_LEN, amax_compute_algo=AMAX_COMPUTE_ALGO)
    return getattr(recipe, RECIPE)(**kwargs)


def fp8_autocast(enabled=True, **kwargs):
    """transformer_engine.pytorch.fp8_autocast with this recipe (extra kwargs, e.g. fp8_group, pass through)."""
    te, _ = _transformer_engine()
    return te.fp8_autocast(enabled=enabled, fp8_recipe=fp8_recipe(), **kwargs)
'''


TE_RECIPE_CLASSES = {"te-delayed": "DelayedScaling", "te-current": "Float8CurrentScaling",
                     "te-blockwise": "Float8BlockScaling", "te-mxfp8": "MXFP8BlockScaling"}
"""Transformer Engine's recipe class of each te-* recipe (TransformerEngine @d0067d0 common/recipe/__init__.py:173,
286, 392, 337; each takes ``fp8_format``, DelayedScaling also the amax history and algorithm, :254-256)."""


def te_fp8_recipe_snippet(plan: ParallelPlan, summary: str | None = None, recipe: str | None = None) -> str:
    """The text of ``te_fp8_recipe.py`` for an FP8 plan (valid Python; imports without Transformer Engine);
    ``summary``: the plan's line in its docstring (default: its notation without the engine's tag); ``recipe``: the
    plan's Transformer Engine recipe (default: the plan's, else te-delayed), whose class the file builds."""
    if plan.precision != "fp8":
        raise InputError([f"the FP8 recipe applies to fp8 plans; this plan trains in {plan.precision}"],
                         subject="precision")
    recipe = recipe or plan.fp8_recipe or "te-delayed"
    if recipe not in TE_RECIPE_CLASSES:
        why = (f"te_fp8_recipe.py builds a Transformer Engine recipe; {recipe} is torchao's: its engine converts "
               "the linears")
        raise InputError([why], subject="precision")
    summary = (summary or plan_notation(plan)).replace('"', "'").replace("\n", " ")
    return _SNIPPET.format(summary=summary, format_upper=fp8_format(recipe).upper(), history=FP8_AMAX_HISTORY_LEN,
                           algo=FP8_AMAX_COMPUTE_ALGO, recipe_class=TE_RECIPE_CLASSES[recipe], recipe_name=recipe)
