"""A torchtitan TOML job config for an FSDP2 / HSDP / TP / PP / CP / EP / Float8 plan.

For torchtitan v0.2.2 (pytorch/torchtitan at 73a0e69): the TOML job configs end with the v0.2.x releases
(later torchtitan takes Python config modules). Section and field names are those of
``torchtitan/config/job_config.py`` at that tag, shipped as ``torchtitan_keys.json``; every one written exists
there (tests/emit/test_torchtitan.py, which also loads the file with torchtitan's own ConfigManager).

Launch (torchtitan checkout): ``NGPU=8 CONFIG_FILE=job.toml ./run_train.sh``, or
``torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file job.toml``.

The mapping (torchtitan's own semantics, job_config.py):
- dp = data_parallel_replicate_degree x data_parallel_shard_degree (HSDP when both > 1; ZeRO-0: pure
  replication); ZeRO-3 = ``fsdp_reshard_after_forward = "always"``, ZeRO-2 = ``"never"``;
- batch: without PP, ``local_batch_size`` is the micro-batch and torchtitan accumulates gradients up to
  ``global_batch_size``; with PP, ``local_batch_size`` is a rank's whole batch, cut into micro-batches of
  ``pipeline_parallel_microbatch_size``;
- PP: ``1F1B``, or ``Interleaved1F1B`` over the plan's pp x vpp split (``pipeline_parallel_layers_per_stage``
  where it gives it, else ``module_fqns_per_model_part``);
- recompute full / selective (op-level SAC) / none; FP8 = the ``quantize.linear.float8`` converter
  (tensorwise scaling, float8 all-gather under FSDP) with ``compile`` on, as torchtitan recommends, or the
  ``quantize.linear.mx`` converter for MXFP8 (``torchao-mxfp8``; eager with TP, which 0.2.2 refuses to compile).
"""

from __future__ import annotations

import re

from autotune.emit.options import EmitOptions
from autotune.emit.torchtitan_models import expert_problems_02, model_problems_02
from autotune.emit.torchtitan_recipes import TORCHTITAN_03_RECIPES
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.layout import split_scheme, torchtitan_split, virtual_layout
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model_preset, preset_matching
from autotune.specs.plan import ParallelPlan

__all__ = ["TORCHTITAN_VERSION", "torchtitan_compiles", "TORCHTITAN_FLAVORS", "torchtitan_job_config", "torchtitan_toml",
           "toml_text", "torchtitan_plan_problems", "expert_parallel_problem", "torchtitan_flavor_note"]

TORCHTITAN_VERSION = "0.2.2"
# Our presets that torchtitan v0.2.2's model registry has as (name, flavor) (torchtitan/models/*/__init__.py). Qwen3
# (qwen3_args, models/qwen3/__init__.py:85-190) and GPT-OSS (gptoss_configs, models/gpt_oss/__init__.py:47-76) are
# mapped where every field the cost model reads equals the preset's (tests/emit/test_torchtitan_flavors.py reads
# the flavors from the source). Qwen3-235B-A22B's flavor has rope_theta 5e6 where the Hugging Face config has 1e6: a
# RoPE base is no cost, so it is mapped (fine-tuning from the Hugging Face weights needs the base fixed). Likewise the
# llama3 flavors: v0.2.2's precompute_freqs_cis (models/llama3/model/model.py:35-80) always applies Llama 3.1's RoPE
# scaling (RoPEScalingArgs: factor 8, low / high 1 / 4, context 8192), which llama3-405b carries and llama3-8b /
# llama3-70b (Llama 3.0 checkpoints) do not: torchtitan trains their Llama 3.1 counterparts, at the same cost.
TORCHTITAN_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
                      "llama3-405b": ("llama3", "405B"), "deepseek-v3": ("deepseek_v3", "671B"),
                      "qwen3-8b": ("qwen3", "8B"), "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
                      "qwen3-235b-a22b": ("qwen3", "235B-A22B"), "gpt-oss-20b": ("gpt_oss", "20b"),
                      "gpt-oss-120b": ("gpt_oss", "120b"),
                      # v0.2.2 models/llama4/__init__.py: the iRoPE flavors (NoPE every 4th layer, 8192-token
                      # chunks on the RoPE layers) are Llama 4's layers; 0.3.0 has no llama4 package
                      "llama4-scout": ("llama4", "17bx16e_irope"), "llama4-maverick": ("llama4", "17bx128e_irope")}


_LLAMA31_ROPE = ("Llama 3.1's RoPE scaling (llama3: factor 8, low / high frequency factors 1 / 4, context 8192; "
                 "v0.2.2 models/llama3/model/model.py:35-80, v0.3.0 ComplexRoPE scaling='llama' in "
                 "models/llama3/__init__.py), which {name} (a Llama 3.0 checkpoint) does not have")
_LLAMA4 = ("its NoPE layers at 0, 4, 8, ... (layer_id % every_n_layers_nope == 0, v0.2.2 "
           "models/llama4/model/model.py:379) where {name} leaves RoPE out of layers 3, 7, 11, ...; no attention "
           "temperature tuning on the NoPE layers (attn_temperature_tuning){qk}; document masking (flex attention, "
           "attn_mask_type block_causal)")
FLAVOR_DIFFERENCES = {"llama3-8b": _LLAMA31_ROPE, "llama3-70b": _LLAMA31_ROPE,
                      "qwen3-235b-a22b": "RoPE base 5,000,000 where {name}'s Hugging Face config has 1,000,000",
                      "llama4-scout": _LLAMA4.replace("{qk}", "; no L2 norm of Q and K on the RoPE layers "
                                                             "(use_qk_norm)"),
                      "llama4-maverick": _LLAMA4.replace("{qk}", "")}
"""What torchtitan's registry flavor builds of a mapped preset that the preset (its checkpoint) does not: none of it
costs anything, so the flavor is mapped, and plan.md says it (torchtitan_flavor_note)."""
FLAVOR_NORM_EPS = {"llama3": 1e-5, "qwen3": 1e-6, "deepseek_v3": 1e-5, "gpt_oss": 1e-5, "llama4": 1e-5}
"""The RMSNorm eps each torchtitan model package builds: v0.2.2 models/<package>/model/args.py ``norm_eps``; v0.3.0
the same (qwen3/__init__.py ``_EPS``, the others models/common/nn_modules.py RMSNorm.Config's default). Compared with
the checkpoint's (ModelSpec.norm_eps) in torchtitan_flavor_note; llama4 (v0.2.2 only): models/llama4/model/args.py."""


def _eps(x: float) -> str:
    """1e-06 as 1e-6."""
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{x:g}")


def torchtitan_flavor_note(model: ModelSpec) -> str | None:
    """plan.md's note where torchtitan's flavor of ``model`` differs from it (None where it is the model): what the
    flavor builds (FLAVOR_DIFFERENCES, its norms' eps: FLAVOR_NORM_EPS), and for a MoE checkpoint trained with a load-balancing loss, that torchtitan
    balances its experts with its auxiliary-loss-free expert bias instead (v0.2.2 models/moe/moe.py:38
    ``load_balance_coeff`` 1e-3; no auxiliary loss in its MoE)."""
    name = preset_matching(model, tuple(TORCHTITAN_FLAVORS))
    if name is None:
        return None
    flavor = TORCHTITAN_FLAVORS[name]
    differs = [FLAVOR_DIFFERENCES[name].format(name=name)] if name in FLAVOR_DIFFERENCES else []
    built = FLAVOR_NORM_EPS[flavor[0]]
    if model.norm_eps is not None and model.norm_eps != built:
        differs.append(f"RMSNorms of eps {_eps(built)} (v0.2.2 models/{flavor[0]}/model/args.py norm_eps, as its 0.3.0 "
                       f"flavor) where {name}'s Hugging Face config has rms_norm_eps {_eps(model.norm_eps)}")
    moe = model.moe
    if moe is not None and moe.aux_loss_coeff:
        differs.append(f"its experts balanced by an auxiliary-loss-free expert bias alone (load_balance_coeff 1e-3, "
                       f"models/moe/moe.py), without {name}'s load-balancing loss (weight {moe.aux_loss_coeff:g}"
                       f"{' per sequence' if moe.aux_loss_per_sequence else ''})")
    if not differs:
        return None
    return (f"torchtitan's {flavor[0]} flavor {flavor[1]!r} trains " + "; and ".join(differs)
            + ": its loss curve is that model's; fine-tuning from the Hugging Face weights needs the flavor changed")


def expert_parallel_problem(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why no file the fsdp engine writes runs ``plan``'s expert parallelism (None when one does): torchtitan runs
    EP inside its own MoE model packages only (v0.2.2: apply_moe_ep_tp in models/deepseek_v3/infra/parallelize.py:126,
    qwen3 :111, gpt_oss :106, llama4 :140; its llama3 has none), built from a registry flavor autotune maps (Llama 4's:
    v0.2.2 only), and the built-in trainer and accelerate's FSDP2 plugin run no EP."""
    if not model.is_moe or plan.ep == 1 or preset_matching(model, tuple(TORCHTITAN_FLAVORS)) is not None:
        return None
    moe = sorted(p for p in TORCHTITAN_FLAVORS if load_model_preset(p).is_moe)
    return (f"ep {plan.ep}: torchtitan runs expert parallelism only in its own MoE models (registry packages "
            f"deepseek_v3, qwen3, gpt_oss, llama4; autotune maps {', '.join(moe)} or their config.json), {model.name} "
            "is none of them, and the built-in trainer and accelerate's FSDP2 run no expert parallelism: use --ep 1 "
            "(FSDP shards the experts), or --engine megatron (Megatron-core's MoE)")


def torchtitan_compiles(plan: ParallelPlan) -> bool:
    """Whether the torchtitan files autotune writes turn ``compile`` on: with Float8, as torchtitan recommends
    (docs/float8.md: the casts fuse into the surrounding ops only under torch.compile). The cost model asks the
    FSDP engine, which answers with this, so the estimate is the estimate of the files. Async TP needs it
    (torchtitan distributed/tensor_parallel.py: "Async TP requires 'model' in --compile.components and
    --compile.enable"). The plan's own ``torch_compile`` wins where it is set. MXFP8 with TP runs eager: torchtitan
    v0.2.2 refuses the two with compile ("TP not yet supported with torch.compile for mxfp8",
    components/quantization/mx.py:46-52)."""
    if plan.torch_compile is not None:
        return plan.torch_compile
    if plan.precision == "fp8" and plan.fp8_recipe == "torchao-mxfp8" and plan.tp > 1:
        return False
    return plan.precision == "fp8" or plan.tp_overlap == "async-tp"


def torchtitan_plan_problems(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                             name: str | None) -> list[str]:
    """What a torchtitan config cannot say of the plan (every version autotune writes for)."""
    out = []
    if name is None:
        out.append(f"torchtitan builds its models from its registry (model name + flavor); {model.name} has no "
                   f"flavor there that autotune knows (it writes files for "
                   f"{', '.join(sorted(TORCHTITAN_FLAVORS))}): emit the nearest of those presets and set "
                   f"[model] name / flavor to your registered model, or use the library call "
                   f"torchtitan_job_config(..., model_name=, flavor=)")
    if plan.world_size != cluster.num_gpus:
        out.append(f"the plan spans {plan.world_size} GPUs (tp*pp*dp*cp) but the cluster has {cluster.num_gpus}")
    if plan.precision == "fp16":
        out.append("torchtitan's mixed_precision_param is bfloat16 or float32 (job_config.py Training): use bf16")
    if plan.optimizer != "adamw":  # the 0.3 module builds default_adamw as well
        out.append(f"optimizer {plan.optimizer}: torchtitan builds Adam or AdamW only (v0.2.2 components/optimizer.py:"
                   f"314-320 optimizer_classes; another name raises NotImplementedError): the file would train with "
                   f"AdamW, whose states the plan does not hold; use your own script, or --optimizer adamw")
    if plan.zero_stage == 1:
        out.append("torchtitan shards with FSDP2 (ZeRO-2: reshard never, ZeRO-3: always) or replicates (ZeRO-0): "
                   "it has no optimizer-only sharding; use zero_stage 0, 2 or 3")
    if plan.zero_stage == 0 and plan.dp_replicate not in (1, plan.dp):
        out.append("zero_stage 0 replicates over all dp ranks: dp_replicate must be dp (or 1)")
    if plan.offload_optimizer != plan.offload_param or "nvme" in (plan.offload_param, plan.offload_optimizer):
        out.append("torchtitan's enable_cpu_offload moves parameters, gradients and optimizer states together to "
                   "CPU: offload both to cpu, or neither")
    if plan.vpp > 1 and not plan.loss_slots and virtual_layout(model.num_layers, plan.pp, plan.vpp, "any") is None:
        out.append(f"vpp={plan.vpp}: number of stages (pp x vpp = {plan.pp * plan.vpp}) cannot be greater than "
                   f"effective layers ({model.num_layers} layers + the embedding + the output; torchtitan "
                   "pipeline_parallel.py generate_llm_fqn_per_model_part): lower vpp")
    return out


def torchtitan_job_config(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None = None,
                          *, model_name: str | None = None, flavor: str | None = None,
                          hf_assets_path: str = "./assets/hf", dataset: str = "c4", chunked_loss: bool = False,
                          release: str = "0.2") -> dict:
    """The job config as nested sections (``toml_text`` writes it). InputError naming every mismatch.
    ``chunked_loss``: the caller writes a chunked loss (the 0.3 module); the TOML cannot. ``release``: the
    torchtitan release whose rules apply (the 0.3 module passes "0.3")."""
    options = options or EmitOptions()
    preset = preset_matching(model, tuple(TORCHTITAN_FLAVORS))  # a config.json of a preset's model too
    known = TORCHTITAN_FLAVORS.get(preset)
    name, flavor = (model_name, flavor) if model_name and flavor else (known or (None, None))
    problems = torchtitan_plan_problems(model, cluster, plan, name)
    if (plan.loss_chunks or 1) > 1 and not chunked_loss:
        problems.append(f"loss_chunks {plan.loss_chunks}: torchtitan 0.2's TOML computes the loss over the whole "
                        "sequence (ChunkedLossWrapper came with 0.3): emit with --engine-version fsdp=0.3, or drop "
                        "--loss-chunks")
    mx = plan.precision == "fp8" and plan.fp8_recipe == "torchao-mxfp8"
    if mx and plan.tp > 1 and torchtitan_compiles(plan) and release == "0.2":
        problems.append("torchao-mxfp8 with tp > 1 under torch.compile: torchtitan 0.2's MXLinearConverter asserts "
                        "\"TP not yet supported with torch.compile for mxfp8\" (components/quantization/mx.py:46-52): "
                        "drop --compile (MXFP8 with TP runs eager there), or emit with --engine-version fsdp=0.3")
    if release == "0.2" and plan.tp > 1 and not plan.sequence_parallel:
        problems.append("sequence_parallel off with tp > 1: torchtitan 0.2's tensor parallelism always shards the "
                        "norms over the sequence (SequenceParallel on norm / attention_norm / ffn_norm, "
                        "models/llama3/infra/parallelize.py:181-233; no TOML key turns it off): emit with "
                        "--engine-version fsdp=0.3 (its enable_sequence_parallel), or drop --no-sequence-parallel")
    if release == "0.2":
        problems += model_problems_02(name, plan, compiles=torchtitan_compiles(plan),
                                      has_03=preset in TORCHTITAN_03_RECIPES)
        problems += expert_problems_02(model, plan)
    if problems:
        raise InputError(problems, subject="torchtitan job config")
    o = options.optimizer
    replicate = plan.dp if plan.zero_stage == 0 else plan.dp_replicate
    parallelism = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": plan.dp // replicate,
        "fsdp_reshard_after_forward": "always" if plan.zero_stage == 3 else "never",
        "tensor_parallel_degree": plan.tp,
        "pipeline_parallel_degree": plan.pp,
        "context_parallel_degree": plan.cp,
        "expert_parallel_degree": plan.ep,
    }
    if model.is_moe and plan.ep > 1 and release == "0.2":
        # The plan's experts are split ep x expert_tp (etp = tp unless the plan says): v0.2.2's default
        # expert_tensor_parallel_degree is 1 (job_config.py:464), which would lend the tp ranks to EP instead.
        parallelism["expert_tensor_parallel_degree"] = plan.expert_tp
    if plan.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan.vpp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = plan.micro_batch_size
        if plan.loss_slots:
            parallelism.update(_loss_slot_fields(model.num_layers, plan.pp, plan.vpp, plan.loss_slots))
        elif plan.vpp > 1:
            parallelism.update(_virtual_stage_fields(model.num_layers, plan.pp, plan.vpp))
    if plan.tp_overlap == "async-tp":  # needs compile (torchtitan_compiles turns it on)
        parallelism["enable_async_tensor_parallel"] = True
    local = plan.micro_batch_size * (plan.grad_accum_steps if plan.pp > 1 else 1)
    config: dict = {
        "job": {"dump_folder": "./outputs", "description": f"autotune plan for {model.name} on {cluster.num_gpus} x "
                                                           f"{cluster.gpu.name}"},
        "metrics": {"log_freq": options.steps_per_print},
        "model": {"name": name, "flavor": flavor, "hf_assets_path": hf_assets_path},
        "optimizer": {"name": "AdamW", "lr": o.lr, "beta1": o.betas[0], "beta2": o.betas[1], "eps": o.eps,
                      "weight_decay": o.weight_decay},
        "lr_scheduler": {"warmup_steps": o.warmup_steps, "decay_type": "cosine",
                         "min_lr_factor": o.min_lr / o.lr if o.lr else 0.0},
        "training": {"dataset": dataset, "local_batch_size": local, "global_batch_size": plan.global_batch_size,
                     "seq_len": plan.seq_len, "steps": o.train_steps, "max_norm": o.grad_clip,
                     "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32",
                     "enable_cpu_offload": plan.offload_param == "cpu"},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": plan.recompute} | ({"selective_ac_option": "op"}
                                                             if plan.recompute == "selective" else {}),
        "compile": {"enable": torchtitan_compiles(plan), "components": ["model", "loss"]},
        "checkpoint": {"enable": True, "folder": options.checkpoint.save_dir,
                       "interval": options.checkpoint.interval_steps or 500,
                       "keep_latest_k": options.checkpoint.keep_last,
                       "async_mode": "async" if options.checkpoint.async_save else "disabled"},
    }
    if mx:
        # torchtitan v0.2.2 docs/mxfp8.md (its example TOML): the MX linear converter with the cuBLAS recipe and the
        # CUDA dim-1 cast kernel ("CUDA is recommended for best performance", job_config.py MXLinear), the output
        # layer left in bf16 (MXLinear.filter_fqns default); MoE experts through quantize.grouped_mm.mx, the router
        # gate left out. No FP8 all-gather option: MX weights are gathered in bf16 (docs/mxfp8.md:179).
        moe = model.is_moe
        config["model"]["converters"] = ["quantize.linear.mx"] + (["quantize.grouped_mm.mx"] if moe else [])
        config["quantize"] = {"linear": {"mx": {"recipe_name": "mxfp8_cublas", "mxfp8_dim1_cast_kernel_choice": "cuda",
                                                "filter_fqns": ["output"] + (["router.gate"] if moe else [])}}}
        if moe:
            config["quantize"]["grouped_mm"] = {"mx": {"recipe_name": "mxfp8", "fqns": ["experts"]}}
    elif plan.precision == "fp8":
        config["model"]["converters"] = ["quantize.linear.float8"]
        # The default (tensorwise) recipe gathers FP8 weights under FSDP; a recipe_name refuses that
        # (components/quantization/float8.py asserts enable_fsdp_float8_all_gather off with a recipe_name).
        rowwise = plan.fp8_recipe == "torchao-rowwise"
        fsdp = plan.dp // replicate > 1 and not rowwise
        config["quantize"] = {"linear": {"float8": {"enable_fsdp_float8_all_gather": fsdp,
                                                    "precompute_float8_dynamic_scale_for_fsdp": fsdp,
                                                    **({"recipe_name": "rowwise"} if rowwise else {}),
                                                    "filter_fqns": ["output"]}}}
    return config


def _virtual_stage_fields(num_layers: int, pp: int, vpp: int) -> dict:
    """The [parallelism] fields that make torchtitan v0.2.2 build the plan's pp x vpp split
    (``virtual_layout(L, pp, vpp, "any")``). torchtitan's stage count is ceil((layers + first_less + last_less) /
    layers_per_stage) and its split counts the embedding and the output as first_less / last_less layers
    (pipeline_parallel.py:71-115, 236-344 at v0.2.2)."""
    stages = pp * vpp
    counts = virtual_layout(num_layers, pp, vpp, "any")
    if num_layers % stages == 0:  # equal chunks: 0 keeps pp x vpp stages of layers / (pp x vpp) each
        return {"pipeline_parallel_layers_per_stage": num_layers // stages,
                "pipeline_parallel_first_stage_less_layers": 0, "pipeline_parallel_last_stage_less_layers": 0}
    if counts == torchtitan_split(num_layers, stages):
        # torchtitan's own split with the default first/last_stage_less_layers = 1 (job_config.py:377-388), where
        # a layers_per_stage gives pp x vpp stages; Llama 3 405B's: 126 layers, 1 a stage, 128 stages, the first
        # with the embedding alone, the last with the norm + output alone.
        for per in range(1, num_layers + 1):
            if -(-(num_layers + 2) // per) == stages:
                return {"pipeline_parallel_layers_per_stage": per,
                        "pipeline_parallel_first_stage_less_layers": 1, "pipeline_parallel_last_stage_less_layers": 1}
    # Any other split: the module names of every stage (job_config.py:367; used as given, pipeline_parallel.py:117-121).
    return {"module_fqns_per_model_part": _stage_names(counts)}


def _loss_slot_fields(num_layers: int, pp: int, vpp: int, k: int) -> dict:
    """The [parallelism] fields of a plan's ``loss_slots`` k: torchtitan v0.2.2's own split with the embedding as 1
    layer and the norm + output as k (``pipeline_parallel_first/last_stage_less_layers``, job_config.py:377-388;
    pytorch/torchtitan@73a0e69 torchtitan/distributed/pipeline_parallel.py:67-68, 119-121), over pp stages with 1F1B
    (one a rank, :110-115), over pp x vpp with the ``pipeline_parallel_layers_per_stage`` that gives that many
    (ceil((L + 1 + k) / per), :71-77), else the same split as module names (which torchtitan then uses as given; the
    two weights stay, so ``estimate --from`` reads k back): ``layout.virtual_layout(L, pp, vpp, "any+lossK...")``."""
    weights = {"pipeline_parallel_first_stage_less_layers": 1, "pipeline_parallel_last_stage_less_layers": k}
    if vpp == 1:
        return weights
    stages, effective = pp * vpp, num_layers + 1 + k
    per = next((n for n in range(1, effective + 1) if -(-effective // n) == stages), None)
    if per is not None:
        return {"pipeline_parallel_layers_per_stage": per} | weights
    counts = virtual_layout(num_layers, pp, vpp, split_scheme("any", None, num_layers, pp, vpp, k))
    return {"module_fqns_per_model_part": _stage_names(counts)} | weights


def _stage_names(counts) -> list[list[str]]:
    """torchtitan v0.2.2's module names of each (virtual) stage holding ``counts`` layers, first to last."""
    names, first = [], 0
    for n in counts:
        names.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    names[0].insert(0, "tok_embeddings")
    names[-1] += ["norm", "output"]
    return names


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    text = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def toml_text(config: dict, header: str = "") -> str:
    """TOML for nested sections of scalars and lists (tables nested as ``[a.b.c]``)."""
    lines = [header.rstrip("\n")] if header else []

    def table(path: list[str], body: dict) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict)}
        if scalars or not body:
            lines.append("")
            lines.append(f"[{'.'.join(path)}]")
            lines.extend(f"{k} = {_value(v)}" for k, v in scalars.items())
        for k, v in body.items():
            if isinstance(v, dict):
                table(path + [k], v)

    for section, body in config.items():
        table([section], body)
    return "\n".join(lines).lstrip("\n") + "\n"


def torchtitan_toml(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None = None,
                    **kw) -> str:
    """The TOML file (see :func:`torchtitan_job_config` for ``kw``)."""
    config = torchtitan_job_config(model, cluster, plan, options, **kw)
    header = (f"# torchtitan v{TORCHTITAN_VERSION} job config written by autotune (TOML job configs end with the "
              f"v0.2.x releases).\n# NGPU={cluster.gpus_per_node} CONFIG_FILE=THIS_FILE ./run_train.sh   "
              f"(in a torchtitan v{TORCHTITAN_VERSION} checkout; {cluster.num_nodes} node(s))\n")
    return toml_text(config, header)
