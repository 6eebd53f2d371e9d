"""Megatron-Bridge overrides (bridge_overrides.yaml / bridge_overrides.args), checked by Bridge's own code.

Each case's files are applied, in a subprocess, to the base recipe's ConfigContainer by megatron-bridge 0.6.2's
``process_config_with_overrides`` (the YAML as a config file, the args as Hydra overrides, as run_recipe.py passes
them); then Bridge's ``runtime_config_update`` (what run_recipe.py --dry-run and training run: mixed precision and
comm-overlap setup, then ``ConfigContainer.validate()``) runs with WORLD_SIZE set to the plan's GPU count. The
resulting config must hold the plan's values, both forms must give the same config, and no key may be one Bridge
skips (its merge only logs a warning for an unknown YAML key: every leaf is looked up on the container here).

Tooling: megatron-bridge 0.6.2, megatron-core 0.19.2 and what ``megatron.bridge.recipes`` imports beyond this
environment, pinned, are pip-installed with ``--no-deps --ignore-requires-python --target`` into
~/.cache/autotune-test-tools/megatron-bridge-0.6 (AUTOTUNE_TEST_TOOLS moves the cache) under a file lock and an atomic
rename; no PyPI: the tests skip, saying so. Bridge 0.6 declares Python >= 3.12; its source parses under 3.11 (no
PEP 695 syntax); megatron-core 0.19.2 imports ``typing.override`` (3.12), given from typing_extensions in the probe.

Stand-ins (a module folder the test writes, first on the probe's path; nothing in the user's install):
Transformer Engine, apex, HF ``datasets``, ``diffusers``, ``modelopt``, ``megatron.energon``, tensorboard and
protobuf are imported at module level by Bridge's package (model bridges, data loaders, the checkpoint and logging
modules) but nothing builds a config with them; they are replaced by empty modules whose attributes are inert
classes. With TE stood in, Bridge's comm-overlap setup sees TE as present (as on a GPU node). The library recipes'
Hugging Face configs (``AutoBridge.from_hf_pretrained``: every recipe of ``megatron_bridge_recipes.RECIPES``) come from
a local hub cache written from the model presets (bridge_hub.py, HF_HUB_OFFLINE=1). No GPU code runs: ``validate()``
itself needs none; a case Bridge refuses fails alone (its traceback), the others still run.
"""

from __future__ import annotations

import json

import pytest
from bridge_cases import CASES, CKPT, LOCAL, case_files, case_model, case_plan  # tests/emit/ is on sys.path
from bridge_probe import run_bridge_probe

from autotune.emit.megatron_bridge import bridge_recipe
from autotune.emit.megatron_bridge_recipes import GENERIC, RECIPES
from autotune.emit.megatron_layout import cp_comm_setting, megatron_split, split_target
from autotune.emit.megatron_model_flags import fp32_routing
from autotune.emit.options import EmitOptions
from autotune.emit.precision import MEGATRON_FP8_RECIPES


PROBE = r"""
import importlib, json, logging, os, sys, traceback, types, typing
import typing_extensions
typing.override = typing_extensions.override  # megatron-core 0.19.2 megatron/training/models/gpt.py (Python 3.12)
import autotune_standins  # noqa: F401
from omegaconf import OmegaConf
from megatron.bridge.training.config import runtime_config_update
from megatron.bridge.training.utils.omegaconf_utils import create_omegaconf_dict_config, process_config_with_overrides
import megatron.bridge

skipped = []
class Catch(logging.Handler):
    def emit(self, record):
        text = record.getMessage()
        if "not found in config object" in text or "Could not" in text or "Failed to" in text:
            skipped.append(text)
logging.getLogger("megatron.bridge.training.utils.omegaconf_utils").addHandler(Catch())

def leaves(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict) and "_target_" not in value:  # a _target_ mapping: one value (instantiated)
            yield from leaves(value, prefix + key + ".")
        else:
            yield prefix + key

def build(recipe, **how):
    module, name = recipe
    cfg = getattr(importlib.import_module(module), name)()
    return process_config_with_overrides(cfg, **how)

def dump(cfg):
    return OmegaConf.to_yaml(create_omegaconf_dict_config(cfg)[0])

def stage_layers(m):
    # the transformer layers Megatron-core builds on each virtual stage, in layer order (chunk v of rank p is stage
    # v * pp + p): its layout's decoders, else transformer_block.get_num_layers_to_build for that rank and chunk
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    pp, vpp = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size or 1
    layout = m.pipeline_model_parallel_layout
    return [layout.layout[p][v].count(LayerType.decoder) if layout is not None else
            get_num_layers_to_build(m, vp_stage=v if vpp > 1 else None, pp_rank=p)
            for v in range(vpp) for p in range(pp)]

import torch
out = {"version": megatron.bridge.__version__}
def probe(folder, recipe, world, device):
    # the case's GPU as torch.cuda would report it (Bridge's flex dispatcher check reads it: no GPU runs here)
    torch.cuda.get_device_properties = lambda *_, d=device: types.SimpleNamespace(name=d[0], major=d[1], minor=d[2])
    overrides = OmegaConf.to_container(OmegaConf.load(os.path.join(folder, "bridge_overrides.yaml")))
    args = [l.strip() for l in open(os.path.join(folder, "bridge_overrides.args")) if l.strip() and l[0] != "#"]
    base = getattr(importlib.import_module(recipe[0]), recipe[1])()
    overlap = base.comm_overlap
    before = {"tp_comm_overlap_cfg": overlap is not None and overlap.tp_comm_overlap_cfg is not None,
              "vpp": base.model.virtual_pipeline_model_parallel_size}
    missing = []
    for path in leaves(overrides):
        node = base
        for part in path.split("."):
            if not hasattr(node, part):
                missing.append(path)
                break
            node = getattr(node, part)
    del skipped[:]
    a = build(recipe, config_filepath=os.path.join(folder, "bridge_overrides.yaml"))
    b = build(recipe, cli_overrides=args)
    os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0")
    runtime_config_update(a)
    runtime_config_update(b)
    m, mp, ck = a.model, a.mixed_precision, a.checkpoint
    return args, {
        "before": before, "missing": missing, "skipped": list(skipped), "same": dump(a) == dump(b),
        "parallel": [m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                     m.virtual_pipeline_model_parallel_size, m.context_parallel_size, m.expert_model_parallel_size,
                     m.sequence_parallel, a.data_parallel_size],
        "batch": [a.train.micro_batch_size, a.train.global_batch_size, m.seq_length, a.dataset.seq_length],
        "recompute": [m.recompute_granularity, m.recompute_method, m.recompute_num_layers, m.recompute_modules],
        "tp_comm_overlap": [m.tp_comm_overlap, a.comm_overlap and a.comm_overlap.tp_comm_overlap_cfg],
        "graphs": [m.cuda_graph_impl, sorted(str(x).split(".")[-1] for x in m.cuda_graph_modules or []),
                   bool(m.use_te_rng_tracker), bool(a.rng.te_rng_tracker)],
        "ep_overlap": [m.overlap_moe_expert_parallel_comm, m.delay_wgrad_compute, m.moe_shared_expert_overlap],
        "dispatcher": [m.moe_token_dispatcher_type, m.moe_flex_dispatcher_backend,
                       getattr(m, "moe_flex_dispatcher_num_sms", None)],
        "mtp": m.mtp_num_layers,
        "qk_norm": [m.qk_layernorm, m.qk_l2_norm],
        "router_dtype": m.moe_router_dtype,
        "fp8_attention": m.fp8_dot_product_attention,
        "fp8_output_proj": getattr(m, "fp8_output_proj", None),
        "offload": [m.cpu_offloading, m.cpu_offloading_num_layers, m.cpu_offloading_weights,
                    m.cpu_offloading_activations],
        "fp4": [getattr(m, "fp4", None), getattr(m, "fp4_recipe", None), getattr(m, "fp4_param", None)],
        "precision": [m.bf16, m.fp16, m.fp8, m.fp8_recipe, m.fp8_amax_history_len, m.fp8_amax_compute_algo,
                      a.ddp.fp8_param_gather, str(m.params_dtype)],
        "ddp": [a.ddp.use_distributed_optimizer, a.optimizer.use_distributed_optimizer, a.ddp.overlap_grad_reduce,
                a.ddp.overlap_param_gather, a.ddp.grad_reduce_in_fp32],
        "fsdp": [a.ddp.use_megatron_fsdp, a.dist.use_megatron_fsdp, a.ddp.data_parallel_sharding_strategy,
                 a.ddp.fsdp_double_buffer],
        "optimizer": [a.optimizer.optimizer, a.optimizer.lr, a.optimizer.min_lr, a.optimizer.adam_beta1,
                      a.optimizer.adam_beta2, a.optimizer.adam_eps, a.optimizer.weight_decay, a.optimizer.clip_grad,
                      a.scheduler.lr_warmup_iters, a.scheduler.lr_decay_style, a.train.train_iters],
        "checkpoint": [ck.save, ck.load, ck.save_interval, ck.async_save, ck.ckpt_format],
        "local": [ck.non_persistent_ckpt_type, ck.non_persistent_local_ckpt_dir, ck.non_persistent_save_interval,
                  ck.replication, ck.replication_jump, ck.replication_factor],
        "layout": [str(m.pipeline_model_parallel_layout) if m.pipeline_model_parallel_layout is not None else None,
                   m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage,
                   m.account_for_embedding_in_pipeline_split, m.account_for_loss_in_pipeline_split],
        "stages": stage_layers(m),
        "cp_comm": [m.cp_comm_type, m.hierarchical_context_parallel_sizes],
        "peft": None if a.peft is None else [type(a.peft).__name__, a.peft.dim, a.peft.alpha,
                                             list(a.peft.target_modules), a.peft.dropout, ck.pretrained_checkpoint],
        "shape": [m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.num_query_groups,
                  m.num_moe_experts, m.moe_router_topk, m.moe_token_dispatcher_type, m.normalization,
                  getattr(m.activation_func, "__name__", str(m.activation_func)), m.gated_linear_unit,
                  m.activation_func_clamp_value],
    }

for folder, recipe, world, device in json.loads(sys.argv[1]):
    try:
        args, out[folder] = probe(folder, recipe, world, device)
    except Exception:  # what Bridge refuses of one case fails that case; the others still run
        out[folder] = {"error": traceback.format_exc()[-3000:]}
        continue
    # Bridge's validation does refuse a plan it cannot run: a global batch no data-parallel split divides.
    if recipe[1].startswith("llama3_70b"):
        bad = build(recipe, cli_overrides=args + ["train.global_batch_size=3"])
        try:
            runtime_config_update(bad)
            out["refused"] = None
        except Exception as err:
            out["refused"] = f"{type(err).__name__}: {err}"[:300]
print("PROBE-RESULT " + json.dumps(out, default=str))
"""


# What torch.cuda.get_device_properties reports on each case's GPU (name, major, minor): the preset's compute
# capability, NVIDIA's product names as nvidia-smi shows them.
DEVICES = {"b200": ("NVIDIA B200", 10, 0), "h100-sxm-80gb": ("NVIDIA H100 80GB HBM3", 9, 0)}


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """What Bridge built from each case's files (one subprocess for all)."""
    root = tmp_path_factory.mktemp("bridge")
    jobs, cases = [], {}
    for case, model, num_gpus, kw in CASES:
        m, cluster, plan = case_plan(model, num_gpus, kw)
        folder = root / case
        folder.mkdir()
        pretrained = root / "pretrained"  # Bridge's CheckpointConfig.finalize asserts that it exists
        pretrained.mkdir(exist_ok=True)
        for name, text in case_files(m, cluster, plan, LOCAL if case == "8b-full-recompute" else CKPT,
                                 str(pretrained)).items():
            (folder / name).write_text(text)
        recipe = bridge_recipe(m)
        jobs.append([str(folder), [recipe.module, recipe.name], num_gpus, DEVICES[cluster.gpu.name]])
        cases[case] = (str(folder), m, plan, cluster)
    data = run_bridge_probe(root, PROBE, json.dumps(jobs))
    assert data["version"] == "0.6.2"
    return data, {case: (data[folder], *rest) for case, (folder, *rest) in cases.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_bridge_applies_and_validates_the_plan(applied, case):
    got, m, plan, cluster = applied[1][case]
    assert "error" not in got, got.get("error")
    assert got["missing"] == [] and got["skipped"] == [], (got["missing"], got["skipped"])
    assert got["same"], "bridge_overrides.yaml and bridge_overrides.args gave different configs"
    dp = plan.world_size // (plan.tp * plan.pp * plan.cp)
    assert got["parallel"] == [plan.tp, plan.pp, plan.vpp if plan.vpp > 1 else None, plan.cp, plan.ep,
                               plan.sequence_parallel, dp]
    assert got["batch"] == [plan.micro_batch_size, plan.global_batch_size, plan.seq_len, plan.seq_len]
    # megatron-core's TransformerConfig fills recompute_modules with its default ["core_attn"] when left null
    assert got["recompute"] == {"none": [None, None, None, ["core_attn"]],
                                "full": ["full", "block", plan.recompute_num_layers, ["core_attn"]],
                                "selective": ["selective", None, None,
                                              list(plan.recompute_modules or ("core_attn",))]}[plan.recompute]
    assert got["tp_comm_overlap"] == [plan.tp_overlap == "userbuffers", None]
    n_off = plan.activation_offload_layers
    assert got["offload"] == ([True, n_off, False, True] if n_off else [False, 0, False, True]), got["offload"]
    # the shared experts beside the dispatch: never, as Megatron-LM runs the plan (megatron_rules.ep_overlap_rules)
    assert got["ep_overlap"] == [plan.ep_overlapped, plan.ep_overlap == "a2a-delay-wgrad", False], got["ep_overlap"]
    graphs = plan.cuda_graph not in (None, "none")
    impl = {"full-iteration": "full_iteration"}.get(plan.cuda_graph or "none", plan.cuda_graph or "none")
    assert got["graphs"][:2] == [impl, sorted(plan.cuda_graph_scope or ())]
    assert got["graphs"][2:] == ([True, True] if graphs else got["graphs"][2:])
    # the plan's split of the layers (emit/megatron_layout.py, as megatron_args writes it), whatever the recipe set:
    # Megatron-core's layout string (80 layers over pp 4 x vpp 3, with 3 loss slots; Kimi-K2's 61 over pp 16 x vpp 2,
    # in place of its recipe's layout), the first and last stages' counts (Qwen3-235B-A22B's 94 over pp 16), the
    # embedding and loss counted as a layer each (Llama 3.1 405B's 126 over pp 8 x vpp 2); the layers Megatron-core
    # builds on each virtual stage are the cost model's
    split = megatron_split(m.num_layers, plan.pp, plan.vpp, plan.mtp_layers, plan.loss_slots)
    assert got["layout"][1:] == [split.first, split.last, split.account_embedding, split.account_loss], got["layout"]
    assert (got["layout"][0] is None) is (split.layout is None), got["layout"]
    assert got["stages"] == list(split_target(m.num_layers, plan.pp, plan.vpp, plan.mtp_layers, plan.loss_slots))
    assert sum(got["stages"]) == m.num_layers and len(got["stages"]) == plan.pp * plan.vpp, got["stages"]
    if case in ("70b-uneven-layout", "70b-loss-slots"):  # Megatron-core's layout string, parsed by Bridge
        assert got["layout"][0], got["layout"]
        if plan.loss_slots:  # the last virtual stage: 80 + 1 + 3 slots over 12, 7 each, 4 layers and the loss's 3
            assert str(got["layout"][0]).endswith("|ttttL"), got["layout"]
    # context parallelism's exchange: the plan's (GPT-OSS's sinks and sliding windows need a2a), else Megatron's p2p
    if plan.cp > 1:
        setting = cp_comm_setting(plan, cluster.gpus_per_node)
        assert got["cp_comm"] == ([setting[0], list(setting[1]) if setting[1] else None] if setting else [None, None])
    fp8 = plan.precision == "fp8"
    delayed = fp8 and plan.fp8_recipe in (None, "te-delayed")
    recipe = MEGATRON_FP8_RECIPES[plan.fp8_recipe or "te-delayed"]
    fmt = "e4m3" if plan.fp8_recipe == "te-mxfp8" else "hybrid"  # Bridge's bf16_with_mxfp8_mixed, TE's MXFP8 default
    assert got["precision"] == [True, False, fmt if fp8 else None, recipe if fp8 else got["precision"][3],
                                1024 if delayed else got["precision"][4], "max" if delayed else got["precision"][5],
                                fp8 and plan.zero_stage >= 1, "torch.bfloat16"]
    nvfp4 = plan.precision == "fp4"  # Megatron's --fp4-format e2m1 --fp4-recipe nvfp4, NVFP4 weights with dist-opt
    assert got["fp4"][0] == ("e2m1" if nvfp4 else None)
    if nvfp4:
        assert "nvfp4" in str(got["fp4"][1]) and got["fp4"][2] is (plan.zero_stage >= 1), got["fp4"]
    assert got["ddp"] == [plan.zero_stage >= 1] * 2 + [plan.overlap_comm, plan.overlap_comm and plan.zero_stage >= 1,
                                                       plan.grad_dtype is None]  # after the precision's setup
    strategy = {2: "optim_grads", 3: "optim_grads_params"}.get(plan.zero_stage)
    assert got["fsdp"] == ([True, True, strategy, True] if strategy else [False, False, got["fsdp"][2], False])
    o = EmitOptions().optimizer
    assert got["optimizer"] == ["adam", o.lr, o.min_lr, o.betas[0], o.betas[1], o.eps, o.weight_decay, o.grad_clip,
                                o.warmup_steps, "cosine", o.train_steps]
    assert got["checkpoint"] == [CKPT.save_dir, CKPT.save_dir, CKPT.interval_steps, True,
                                 "fsdp_dtensor" if strategy else "torch_dist"]
    if case == "8b-full-recompute":
        assert got["local"] == ["local", LOCAL.local_dir, LOCAL.local_interval_steps, True, 8, 2]
    else:
        assert got["local"][0] is None and got["local"][3] is False
    moe = m.moe
    assert got["shape"][:5] == [m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_heads]
    kind, _, backend = (plan.moe_dispatcher or "alltoall").partition("-")
    assert got["shape"][5:8] == ([moe.num_experts, moe.top_k, kind] if moe else [None, got["shape"][6],
                                                                              got["shape"][7]])
    if moe:  # (a flex plan's check in Bridge's validate asks the CUDA device which GPU it is,
        # training/flex_dispatcher_backend.py:102-119: the probe answers with the case's GPU, DEVICES)
        assert got["dispatcher"] == [kind, backend or None, None]  # a flex backend's own SM count
    assert got["mtp"] == (plan.mtp_layers or None), got["mtp"]
    # the library recipe's or the one written; MLA's qk_layernorm is its latent norms (MLASpec counts them)
    assert got["qk_norm"] == [m.qk_norm == "head" or m.mla is not None, m.qk_norm == "l2"], got["qk_norm"]
    # the router in fp32 from 32 experts, as the Megatron-LM arguments say it (library recipes' bridges included)
    assert got["router_dtype"] == ("fp32" if moe is not None and fp32_routing(moe) else None), got["router_dtype"]
    assert got["fp8_attention"] is bool(plan.fp8_attention)  # mixed_precision's, set on the model at setup
    assert got["fp8_output_proj"] is bool(plan.fp8_output_proj)  # the MXFP8 LM head: TransformerConfig's field
    # SwiGLU; GPT-OSS's clamps at 7 and gates with x * sigmoid(1.702 x): Megatron-core's quick_gelu GLU with
    # activation_func_clamp_value (v0.6.0 models/gpt_oss/gpt_oss_bridge.py)
    assert got["shape"][8:] == ["RMSNorm", "quick_gelu" if m.activation_clamp else "silu", True, m.activation_clamp]
    assert got["peft"] is None if plan.peft is None else (
        got["peft"][:5] == ["LoRA", plan.lora_rank, plan.lora_alpha, list(plan.lora_targets), 0.0]
        and got["peft"][5].endswith("/pretrained")), got["peft"]


@pytest.mark.slow
def test_the_tp4_recipe_is_reset_and_bridge_refuses_what_it_cannot_run(applied):
    data, cases = applied
    got = cases["70b-tp8-pp4-vpp"][0]
    # The 70B recipe carries TP-4 userbuffers and VPP 5: after the overrides the TP-8 plan has neither.
    assert got["before"] == {"tp_comm_overlap_cfg": True, "vpp": 5}
    assert got["parallel"][:3] == [8, 4, 2] and got["tp_comm_overlap"] == [False, None]
    assert cases["8b-full-recompute"][0]["parallel"][2] is None  # VPP null without interleaving
    assert data["refused"] and "global_batch_size (3) must be divisible" in data["refused"], data["refused"]


def test_every_library_recipe_is_built():
    # each recipe autotune maps a preset to (and the generic one) is a case here, its hub config in bridge_hub.py
    built = {bridge_recipe(case_model(model)).name for _, model, _, _ in CASES}
    assert {r.name for r in RECIPES.values()} | {GENERIC.name} <= built, sorted({r.name for r in RECIPES.values()}
                                                                                 - built)
