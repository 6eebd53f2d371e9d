"""A torchtitan 0.3 config module for an FSDP2 / HSDP / TP / PP / CP / EP / Float8 plan.

torchtitan 0.3.0 has no TOML job configs: ``python -m torchtitan.train --module M --config FN`` imports ``M``
(a name outside its model list is imported as given, after trying ``M.config_registry``: so the bundle folder
must be on the import path) and calls ``FN()``, which returns a ``Trainer.Config``; ``--section.key`` flags
override it (torchtitan/config/manager.py ``ConfigManager._load_config``). Float8 converters live in
``model_spec`` (built by the model's ``model_registry``), which no flag reaches.

The module written here starts from torchtitan's own recipe for the model (``llama3_8b()``, ...: tokenizer
path, dataset, loss) and replaces, with ``dataclasses.replace`` (so ``Trainer.Config.__post_init__``
checks the result), what the plan fixes: ``model_spec`` (Float8 or MXFP8 converters for fp8 plans, none otherwise),
``parallelism``, ``training`` (batch, sequence, mixed precision, offload), ``activation_checkpoint``
(``FullAC`` / op-level ``SelectiveAC`` / None), ``compile``, ``optimizer``, ``lr_scheduler``, ``metrics.log_freq``
and ``checkpoint``. The values are those of the v0.2 TOML (autotune/emit/torchtitan.py): the same mapping,
in 0.3's names. Names checked against torchtitan 0.3.0 (tests/emit/test_torchtitan03.py loads the module
with its ConfigManager).
"""

from __future__ import annotations

import functools
import textwrap

from autotune.emit.options import EmitOptions
from autotune.emit.torchtitan import torchtitan_job_config, torchtitan_plan_problems
from autotune.emit.torchtitan_models import model_problems_03
from autotune.emit.torchtitan_recipes import NO_RECIPE_03, ROPE_POSITIONS_03, TORCHTITAN_03_RECIPES
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.layout import torchtitan_scheme, virtual_layout
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import preset_matching

__all__ = ["TORCHTITAN_03_VERSION", "TORCHTITAN_03_RECIPES", "NO_RECIPE_03", "MODULE_FILE", "CONFIG_FUNCTION",
           "torchtitan_module", "torchtitan_run_line", "rope_positions_note"]

TORCHTITAN_03_VERSION = "0.3.0"
MODULE_FILE = "torchtitan_plan.py"
CONFIG_FUNCTION = "plan"
# What MXFP8LinearConverter converts (its ``fqns``: an include list, substring match; empty converts every Linear, the
# output layer too: torchtitan 0.3.0 components/quantization/mx.py:53-60, 79-83): the block linears, lm_head and the
# MoE router gate left in bf16 as the 0.2 TOML and the cost model have them (deepseek_v3/config_registry.py:84-99
# names attention, shared_experts, feed_forward the same way).
# Qwen3's MoE blocks hold attention + moe (qwen3/sharding.py:71-110), GPT-OSS's attention + moe (gpt_oss/__init__.py:
# 239-244): their experts go through the grouped-experts converter, the router gates stay out.
MX_FQNS = {"llama3": ["attention", "feed_forward"], "deepseek_v3": ["attention", "shared_experts", "feed_forward"],
           "qwen3": ["attention", "feed_forward"], "gpt_oss": ["attention"]}
_PARALLELISM_KEYS = ("data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                     "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                     "expert_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size")
# torchtitan 0.3.0 torchtitan/config/configs.py:191-197 (ParallelismConfig), the same fields as 0.2.2's
_LOSS_SLOT_KEYS = ("pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers")
_TRAINING_KEYS = ("local_batch_size", "global_batch_size", "seq_len", "steps", "max_norm", "mixed_precision_param",
                  "mixed_precision_reduce", "enable_cpu_offload")


def _problems_03(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    out = []
    preset = preset_matching(model, (*NO_RECIPE_03, *TORCHTITAN_03_RECIPES))  # a config.json of one too
    if preset in NO_RECIPE_03:
        out.append(f"torchtitan 0.3 builds models from its recipes: {preset}'s {NO_RECIPE_03[preset]}: emit "
                   "with --torchtitan-version 0.2 for a TOML (v0.2.2 has the flavor), or write the module by hand")
    elif preset not in TORCHTITAN_03_RECIPES:
        out.append(f"torchtitan 0.3 builds models from its recipes; {model.name} has none that autotune knows "
                   f"(known: {', '.join(sorted(TORCHTITAN_03_RECIPES))}): emit with --torchtitan-version 0.2 "
                   "for a TOML, or write the module by hand")
    layers_per_stage = -(-model.num_layers // plan.pp)
    if plan.recompute == "full" and plan.recompute_num_layers not in (None, layers_per_stage):
        out.append(f"torchtitan 0.3's FullAC checkpoints every block (distributed/activation_checkpoint.py "
                   f"FullAC): recompute_num_layers {plan.recompute_num_layers} of {layers_per_stage} per stage "
                   "cannot be said; recompute all layers")
    replicate = plan.dp if plan.zero_stage == 0 else plan.dp_replicate
    dense = plan.dp // replicate * plan.cp * plan.tp
    if plan.ep > 1 and dense % plan.ep:
        out.append(f"torchtitan 0.3 borrows the expert-parallel ranks from dp_shard x cp x tp = {dense} "
                   f"(config/configs.py expert_parallel_degree): ep {plan.ep} does not divide it")
    if plan.tp_overlap == "async-tp":
        out.append("torchtitan 0.3 has no async tensor parallelism (ParallelismConfig has no "
                   "enable_async_tensor_parallel): emit with --engine-version fsdp=0.2, or drop --tp-overlap")
    if plan.precision == "fp8" and plan.fp8_recipe == "torchao-tensorwise":
        out.append("torchtitan 0.3's Float8LinearConverter runs rowwise recipes only (components/quantization/"
                   "float8.py recipe_name: rowwise, rowwise_with_gw_hp): use --fp8-recipe torchao-rowwise, or emit "
                   "with --engine-version fsdp=0.2")
    return out


def torchtitan_run_line(cluster: ClusterSpec, *, bundle: str = "<bundle>") -> str:
    """The torchrun command that runs the module (torchtitan 0.3 installed; ``bundle``: the bundle folder)."""
    nodes = "--nnodes 1" if cluster.num_nodes == 1 else (
        f"--nnodes {cluster.num_nodes} --rdzv_backend c10d --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT")
    return (f"PYTHONPATH={bundle}:$PYTHONPATH torchrun {nodes} --nproc_per_node {cluster.gpus_per_node} "
            f"-m torchtitan.train --module {MODULE_FILE[:-3]} --config {CONFIG_FUNCTION}")


def _kwargs(values: dict, indent: str) -> str:
    return "".join(f"\n{indent}{k}={v!r}," for k, v in values.items())


def _docstring(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, parallelism: dict, recipe_fn: str) -> str:
    dp_note = ("ZeRO-3: reshard after forward" if plan.zero_stage == 3 else
               "ZeRO-2: kept gathered until backward" if plan.zero_stage == 2 else "ZeRO-0: replicated")
    fill = functools.partial(textwrap.fill, width=100)
    paragraphs = [
        f"torchtitan {TORCHTITAN_03_VERSION} config module written by autotune: {model.name} on {cluster.num_gpus} x "
        f"{cluster.gpu.name} ({cluster.num_nodes} node(s)).",
        f"Plan: tp {plan.tp}, pp {plan.pp}" + (f" x vpp {plan.vpp}" if plan.vpp > 1 else "") + f", cp {plan.cp}, "
        f"dp {plan.dp} (replicate {parallelism['data_parallel_replicate_degree']} x shard "
        f"{parallelism['data_parallel_shard_degree']}; {dp_note}), ep {plan.ep}; micro-batch {plan.micro_batch_size}, "
        f"{plan.grad_accum_steps} micro-batch(es) per step, global batch {plan.global_batch_size} x {plan.seq_len} "
        f"tokens; {plan.precision}; recompute {plan.recompute}.",
        f"torchtitan's own {recipe_fn}() recipe (tokenizer, dataset, loss) with the plan on top. Run it with "
        f"torchtitan {TORCHTITAN_03_VERSION} installed and this folder (<bundle>) on the import path (torchtitan "
        "imports --module by its name), on every node"
        + (" (MASTER_ADDR / MASTER_PORT: the first node's address and a free port)" if cluster.num_nodes > 1
           else "") + ":",
    ]
    return ("\n\n".join(fill(p) for p in paragraphs) + f"\n\n    {torchtitan_run_line(cluster)}\n\n"
            + fill("--section.key flags (--training.steps 10) still override what this module returns.") + "\n")


_STAGES_HELPER = '''

def _stages(layers_per_stage: list[int]) -> list[list[str]]:
    """Module names of each pipeline stage, first to last (stage s runs on pp rank s % pp)."""
    out, first = [], 0
    for count in layers_per_stage:
        out.append([f"layers.{i}" for i in range(first, first + count)])
        first += count
    out[0].insert(0, "tok_embeddings")
    out[-1] += ["norm", "lm_head"]
    return out
'''


_ROPE_HELPER = '''

def _rope_positions(spec, positions: int):
    """The flavor's RoPE tables raised to ``positions``: torchtitan 0.3 refuses a training.seq_len above the
    flavor's max_seq_len; the rotation of every position below it is unchanged (0.2 raised them itself)."""
    for layer in spec.model.layers:
        if getattr(layer, "attention", None) is not None:
            layer.attention.rope = replace(layer.attention.rope, max_seq_len=positions)
    return spec
'''


def _short_rope_tables(model: ModelSpec, plan: ParallelPlan) -> int | None:
    """The positions the flavor's RoPE tables hold where the plan's sequence is longer (None where they suffice);
    the module then calls its ``_rope_positions`` helper (``_ROPE_HELPER``)."""
    held = ROPE_POSITIONS_03.get(preset_matching(model, tuple(ROPE_POSITIONS_03)))
    return held if held is not None and plan.seq_len > held else None


def rope_positions_note(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """plan.md's note where torchtitan_plan.py raises the flavor's RoPE tables to the plan's sequence."""
    held = _short_rope_tables(model, plan)
    if held is None:
        return None
    return (f"torchtitan 0.3's flavor of {model.name} holds RoPE tables for {held:,} positions and refuses a longer "
            f"training.seq_len (models/common/decoder.py, Decoder.Config.update_from_config); torchtitan_plan.py "
            f"raises them to {plan.seq_len:,} (_rope_positions, as torchtitan 0.2 did): the rotation is the "
            f"flavor's, and positions past {held:,} are past the context that flavor was built for")


def torchtitan_module(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                      options: EmitOptions | None = None) -> str:
    """The text of ``torchtitan_plan.py``. InputError naming every part of the plan it cannot say."""
    options = options or EmitOptions()
    recipe = TORCHTITAN_03_RECIPES.get(preset_matching(model, tuple(TORCHTITAN_03_RECIPES)))
    # the model name only says "known" there: _problems_03 says what 0.3 lacks for an unknown one
    problems = torchtitan_plan_problems(model, cluster, plan, model.name) + _problems_03(model, plan)
    if recipe:
        problems += model_problems_03(recipe[0], model, plan)
    if problems:
        raise InputError(problems, subject="torchtitan 0.3 config module")
    package, recipe_fn, flavor, registry_args, fp8_filter, moe = recipe
    config = torchtitan_job_config(model, cluster, plan, options, chunked_loss=True, release="0.3")
    parallelism = {k: config["parallelism"][k] for k in _PARALLELISM_KEYS if k in config["parallelism"]}
    parallelism["enable_sequence_parallel"] = plan.sequence_parallel
    if plan.pp > 1 and plan.loss_slots:  # the stage lists below give the split; the weights say k (estimate --from)
        parallelism |= {k: config["parallelism"][k] for k in _LOSS_SLOT_KEYS}
    stages = ""
    if plan.pp > 1:
        # The plan's own split (autotune.specs.layout, the engine's scheme: torchtitan's own 1F1B split, a plan's
        # loss_slots torchtitan's split with the output as k layers), as module names per stage.
        counts = virtual_layout(model.num_layers, plan.pp, plan.vpp, torchtitan_scheme(plan, model.num_layers))
        stages = f"\n            module_fqns_per_model_part=_stages({list(counts)!r}),"
    training = {k: config["training"][k] for k in _TRAINING_KEYS}
    if plan.pp > 1 or (moe and plan.ep > 1):
        # Trainer.Config refuses CUDA graphs with pipeline parallelism, and with expert parallelism over a token
        # dispatcher that syncs with the host, as the recipes' standard all-to-all does (trainer.py:179-210)
        training["disable_cuda_graphs"] = True
    fp8 = plan.precision == "fp8"
    mx = fp8 and plan.fp8_recipe == "torchao-mxfp8"
    compile_on = config["compile"]["enable"]
    converters = ""
    if mx:
        # pad_multiple 128: "required by the CuTeDSL quantization kernel on sm_100" (deepseek_v3/config_registry.py:86-88)
        converters = (f",\n            converters=[\n                MXFP8LinearConverter.Config(fqns={MX_FQNS[package]!r}, "
                      f"model_compile_enabled={compile_on!r}),"
                      + (f"\n                MXFP8GroupedExpertsConverter.Config(model_compile_enabled={compile_on!r}, "
                         "pad_multiple=128)," if moe else "") + "\n            ]")
    elif fp8:
        converters = (f",\n            converters=[\n                Float8LinearConverter.Config(recipe_name='rowwise', "
                      f"filter_fqns={fp8_filter!r}, model_compile_enabled={compile_on!r}),"
                      + (f"\n                Float8GroupedExpertsConverter.Config(model_compile_enabled={compile_on!r}),"
                         if moe else "") + "\n            ]")
    ac = {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}.get(plan.recompute, "None")
    # The recipe's loss is ChunkedLossWrapper (8 chunks); the plan's count, or its inner loss unchunked.
    chunks = plan.loss_chunks or 1
    loss = f"replace(base.loss, num_chunks={chunks})" if chunks > 1 else "base.loss.loss_fn"
    opt, sched, ckpt = config["optimizer"], config["lr_scheduler"], config["checkpoint"]
    kind = "MXFP8" if mx else "Float8"
    quant = [f"{kind}LinearConverter"] + ([f"{kind}GroupedExpertsConverter"] if moe else [])
    imports = "\n".join([
        "from dataclasses import replace", "",
        "from torchtitan.components.checkpoint import CheckpointManager",
        "from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw",
        *(["from torchtitan.components.quantization import " + ", ".join(quant)] if fp8 else []),
        "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        f"from torchtitan.models.{package} import model_registry",
        f"from torchtitan.models.{package}.config_registry import {recipe_fn}",
        "from torchtitan.trainer import Trainer"])
    registry = f"model_registry({flavor!r}{registry_args}{converters})"
    longer = _short_rope_tables(model, plan)
    if longer is not None:
        registry = f"_rope_positions({registry}, {plan.seq_len})"
    helpers = (_STAGES_HELPER if stages else "") + (_ROPE_HELPER if longer is not None else "")
    return f'''"""{_docstring(model, cluster, plan, parallelism, recipe_fn)}"""

{imports}

__all__ = ["{CONFIG_FUNCTION}"]
{helpers}

def {CONFIG_FUNCTION}() -> Trainer.Config:
    base = {recipe_fn}()
    return replace(
        base,
        model_spec={registry},
        parallelism=ParallelismConfig({_kwargs(parallelism, " " * 12)}{stages}
        ),
        training=TrainingConfig({_kwargs(training, " " * 12)}
        ),
        loss={loss},
        activation_checkpoint={ac},
        compile=CompileConfig(enable={compile_on!r}, components={config["compile"]["components"]!r}),
        optimizer=default_adamw(lr={opt["lr"]!r}, betas=({opt["beta1"]!r}, {opt["beta2"]!r}), eps={opt["eps"]!r},
                                weight_decay={opt["weight_decay"]!r}),
        lr_scheduler=LRSchedulersContainer.Config({_kwargs(sched, " " * 12)}
        ),
        metrics=replace(base.metrics, log_freq={config["metrics"]["log_freq"]!r}),
        checkpoint=CheckpointManager.Config({_kwargs(ckpt, " " * 12)}
        ),
    )
'''
