"""Megatron-LM arguments: every emitted flag exists with a valid value; the Megatron-DeepSpeed form; the
linter catches each validate_args rule; shell files of arguments; the FP8 recipe module."""

import importlib
import shlex
import sys
import types

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.emit.megatron import (
    MEGATRON_DEEPSPEED_FLAGS,
    MEGATRON_NCCL_DEFAULTS,
    megatron_args,
    megatron_args_problems,
    megatron_deepspeed_args,
    megatron_env,
    megatron_flag_table,
    parse_shell_args,
    read_megatron_args_file,
    read_megatron_args_file_with_env,
)
from autotune.emit.options import EmitOptions
from autotune.emit.precision import precision_summary, te_fp8_recipe_snippet
from autotune.engines import engine_for
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


def _setup(model, gpu, num_gpus, **plan):
    m = load_model_preset(model)
    c = load_cluster(gpu=gpu, num_gpus=num_gpus)
    return m, c, make_plan(m, c, **plan)


# (id, model, gpu, GPUs, plan): together they cover vpp, uneven pp, cp, MoE ep, MLA, fp8, fp16, full recompute.
CASES = [
    ("llama3-8b-tp2-selective", "llama3-8b", "h100-sxm-80gb", 8,
     dict(tp=2, global_batch_size=64, zero_stage=1, engine="megatron", recompute="selective")),
    # 80 layers / pp 4 = 20 per stage = 2 virtual chunks of 10; dp 2, 16 = 1 x 8 x 2, 8 micro-batches % pp 4 = 0.
    ("llama3-70b-vpp", "llama3-70b", "h100-sxm-80gb", 64,
     dict(tp=8, pp=4, vpp=2, global_batch_size=16, zero_stage=1, engine="megatron")),
    # 126 layers on pp 16: 7 + 14 x 8 + 7 (Llama 3 paper); FP8; full recompute of 2 layers per stage.
    ("llama3-405b-uneven-fp8-block", "llama3-405b", "h100-sxm-80gb", 1024,
     dict(tp=8, pp=16, global_batch_size=2048, zero_stage=1, engine="megatron", precision="fp8",
          recompute="full", recompute_num_layers=2)),
    ("llama3-8b-cp-fp16-full", "llama3-8b", "a100-80gb", 16,
     dict(tp=2, pp=2, cp=2, global_batch_size=32, zero_stage=0, engine="megatron", precision="fp16",
          recompute="full", seq_len=8192)),
    ("mixtral-ep8", "mixtral-8x7b", "h100-sxm-80gb", 64,
     dict(tp=1, pp=1, ep=8, global_batch_size=256, zero_stage=1, engine="megatron")),
    ("deepseek-v3-mla-ep64", "deepseek-v3", "h100-sxm-80gb", 2048,
     dict(tp=2, pp=1, ep=64, global_batch_size=4096, zero_stage=1, engine="megatron", precision="fp8")),
    ("gpt3-175b-learned-bias", "gpt3-175b", "a100-80gb", 1024,
     dict(tp=8, pp=8, global_batch_size=1024, zero_stage=0, engine="megatron", recompute="full")),
]


def _check_flags_exist(args):
    """Every --flag is in the newest Megatron-core flag table, takes the right number of values, each valid."""
    table = megatron_flag_table()
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), f"stray value {flag!r} at {i}"
        assert flag in table, f"{flag} is not a Megatron-LM flag"
        spec = table[flag]
        i += 1
        if spec.is_switch:
            continue
        assert i < len(args), f"{flag} lacks its value"
        assert spec.value_problem(args[i]) is None, f"{flag} {args[i]!r}: {spec.value_problem(args[i])}"
        i += 1


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_emitted_flag_exists_with_a_valid_value(case):
    _, model, gpu, n, plan_kw = case
    m, c, plan = _setup(model, gpu, n, **plan_kw)
    args = megatron_args(m, c, plan, EmitOptions(), checkpoint_flags=["--save", "ckpt", "--save-interval", "500"])
    _check_flags_exist(args)
    # And our own linter, which applies validate_args, finds nothing wrong with what we write.
    assert megatron_args_problems(args, c.num_gpus, env=megatron_env(plan)) == []


def test_plan_dimensions_become_their_flags():
    m, c, plan = _setup(*CASES[2][1:4], **CASES[2][4])
    args = megatron_args(m, c, plan, fp8_param_gather=engine_for(plan).fp8_param_gather(plan))  # the engine says
    joined = " ".join(args)
    assert "--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7" in joined
    assert "--recompute-granularity full --recompute-method block --recompute-num-layers 2" in joined
    assert ("--bf16 --fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 "
            "--fp8-amax-compute-algo max --fp8-param-gather") in joined
    assert "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather" in joined
    assert "--group-query-attention --num-query-groups 8" in joined
    # Megatron's NullTokenizer adds an EOD token: 128255 + 1 = the model's 128256.
    assert "--vocab-size 128255" in joined

    m, c, plan = _setup(*CASES[1][1:4], **CASES[1][4])
    assert "--num-layers-per-virtual-pipeline-stage 10" in " ".join(megatron_args(m, c, plan))  # 80 / 4 / 2

    m, c, plan = _setup(*CASES[3][1:4], **CASES[3][4])
    joined = " ".join(megatron_args(m, c, plan))
    assert "--context-parallel-size 2" in joined and "--use-distributed-optimizer" not in joined
    assert "--recompute-method uniform --recompute-num-layers 1" in joined  # every layer
    assert "--fp16 --initial-loss-scale 65536" in joined and "--bf16" not in joined
    assert "--overlap-param-gather" not in joined  # only with the distributed optimizer (validate_args 1027)

    m, c, plan = _setup(*CASES[5][1:4], **CASES[5][4])
    joined = " ".join(megatron_args(m, c, plan))
    assert "--expert-model-parallel-size 64" in joined and "--multi-latent-attention" in joined
    assert "--moe-layer-freq ([0]*3+[1]*58)" in joined  # 3 dense layers, then 58 MoE layers
    assert "--moe-shared-expert-intermediate-size 2048" in joined


def test_fp8_param_gather_only_with_the_distributed_optimizer():
    m, c, plan = _setup("llama3-8b", "h100-sxm-80gb", 8, tp=2, global_batch_size=8, zero_stage=0,
                        engine="megatron", precision="fp8")
    args = megatron_args(m, c, plan)
    assert "--fp8-format" in args and "--fp8-param-gather" not in args
    assert megatron_args_problems(args, 8) == []


def test_checkpoint_flags_are_appended_and_data_args_replace_mock_data():
    m, c, plan = _setup("llama3-8b", "h100-sxm-80gb", 8, tp=2, global_batch_size=8, engine="megatron")
    ckpt = ["--save", "/ckpt", "--save-interval", "100", "--async-save", "--use-persistent-ckpt-worker"]
    data = ["--data-path", "/data/text_document", "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", "meta-llama/Meta-Llama-3-8B"]
    args = megatron_args(m, c, plan, checkpoint_flags=ckpt, data_args=data)
    assert args[-len(ckpt):] == ckpt and "--mock-data" not in args
    _check_flags_exist(args)


def test_unrepresentable_plans_are_refused_with_every_reason():
    m, c, plan = _setup("llama3-8b", "h100-sxm-80gb", 8, tp=1, global_batch_size=8, zero_stage=3,
                        engine="deepspeed", offload_optimizer="cpu")
    with pytest.raises(InputError) as err:
        megatron_args(m, c, plan)
    text = str(err.value)
    assert "offload is DeepSpeed's" in text  # ZeRO-3 itself is Megatron-FSDP (test_megatron_fsdp.py)
    bloom = load_model_preset("bloom-176b")
    with pytest.raises(InputError, match="ALiBi"):
        megatron_args(bloom, load_cluster(gpu="a100-80gb", num_gpus=8),
                      ParallelPlan(tp=8, global_batch_size=1, engine="megatron"))


@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (1, 2), (4, 2)])
def test_cuda_device_max_connections_exactly_when_tp_or_cp(tp, cp):
    env = megatron_env(ParallelPlan(tp=tp, cp=cp))
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in env) == (tp > 1 or cp > 1)
    if tp > 1 or cp > 1:
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_nccl_defaults_are_optional_and_extra_wins():
    plan = ParallelPlan(tp=2)
    assert not set(MEGATRON_NCCL_DEFAULTS) & set(megatron_env(plan))
    env = megatron_env(plan, nccl_defaults=True, extra={"NCCL_IB_TIMEOUT": "22", "NCCL_IB_HCA": "mlx5"})
    assert env["NCCL_IB_SL"] == "1" and env["NCCL_IB_TIMEOUT"] == "22" and env["NCCL_IB_HCA"] == "mlx5"


# ---- Megatron-DeepSpeed --------------------------------------------------------------------------
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_megatron_deepspeed_form(zero):
    m, c, plan = _setup("llama3-8b", "h100-sxm-80gb", 16, tp=2, pp=1, global_batch_size=64, zero_stage=zero,
                        engine="deepspeed", recompute="full")
    args = megatron_deepspeed_args(m, c, plan, EmitOptions(), "/run/ds_config.json")
    assert args[:5] == ["--deepspeed", "--deepspeed_config", "/run/ds_config.json", "--zero-stage", str(zero)]
    assert ("--no-pipeline-parallel" in args) == (zero >= 2)
    flags = [a for a in args if a.startswith("--")]
    assert set(flags) <= MEGATRON_DEEPSPEED_FLAGS
    for core_only in ("--use-distributed-optimizer", "--overlap-grad-reduce", "--group-query-attention",
                      "--position-embedding-type"):
        assert core_only not in args
    joined = " ".join(args)
    assert "--num-key-value-heads 8" in joined and "--normalization rmsnorm" in joined
    assert "--checkpoint-activations" in args and "--deepspeed-activation-checkpointing" in args


def test_megatron_deepspeed_refuses_zero3_with_pipeline_and_moe():
    m = load_model_preset("llama3-8b")
    c = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = ParallelPlan(tp=2, pp=2, dp=4, global_batch_size=4, zero_stage=3)
    with pytest.raises(InputError, match="needs pp=1"):
        megatron_deepspeed_args(m, c, plan, None, "ds.json")
    mixtral = load_model_preset("mixtral-8x7b")
    plan = ParallelPlan(tp=1, dp=16, ep=8, global_batch_size=16, zero_stage=3)
    with pytest.raises(InputError, match="ZeRO-3"):
        megatron_deepspeed_args(mixtral, c, plan, None, "ds.json")
    args = megatron_deepspeed_args(mixtral, c, plan.with_(zero_stage=2), None, "ds.json")
    assert "--moe-expert-parallel-size 8" in " ".join(args) and "--no-pipeline-parallel" in args


# ---- the linter: one argv per mistake ------------------------------------------------------------
BASE = {"--num-layers": "32", "--hidden-size": "4096", "--num-attention-heads": "32", "--seq-length": "4096",
        "--max-position-embeddings": "4096", "--micro-batch-size": "1", "--global-batch-size": "64",
        "--tensor-model-parallel-size": "2", "--pipeline-model-parallel-size": "2", "--bf16": True}
WORLD = 16  # tp 2 x pp 2 -> dp 4; 64 = 1 x 16 micro-batches x 4


def argv(**changes):
    """BASE with flags changed: key is the flag without '--' and with '_' for '-'; True: a switch; None: removed."""
    flags = dict(BASE)
    for key, value in changes.items():
        flags["--" + key.replace("_", "-")] = value
    out = []
    for flag, value in flags.items():
        if value is None:
            continue
        out += [flag] if value is True else [flag, str(value)]
    return out


def test_base_argv_is_clean():
    assert megatron_args_problems(argv(), WORLD) == []


MISTAKES = [
    # (id, argv changes, world size, path of the problem, severity)
    ("world-size", {}, 10, "--tensor-model-parallel-size", "error"),                     # 10 % (2*2*1)
    ("heads-tp", {"num_attention_heads": 33}, WORLD, "--num-attention-heads", "error"),
    ("query-groups-tp", {"tensor_model_parallel_size": 4, "group_query_attention": True, "num_query_groups": 6,
                         "global_batch_size": 32}, 32, "--num-query-groups", "error"),
    ("layers-pp", {"num_layers": 33}, WORLD, "--pipeline-model-parallel-size", "error"),
    ("uneven-split", {"pipeline_model_parallel_size": 4, "num_layers": 30, "decoder_first_pipeline_num_layers": 7,
                      "decoder_last_pipeline_num_layers": 6, "global_batch_size": 32}, WORLD,
     "--decoder-first-pipeline-num-layers", "error"),                                  # 30-7-6 = 17 over 2
    ("vpp-divisibility", {"num_layers_per_virtual_pipeline_stage": 3}, WORLD,
     "--num-layers-per-virtual-pipeline-stage", "error"),                               # 16 per stage % 3
    ("interleaved-needs-pp", {"pipeline_model_parallel_size": 1, "num_layers_per_virtual_pipeline_stage": 4},
     WORLD, "--num-layers-per-virtual-pipeline-stage", "error"),
    ("two-vpp-flags", {"num_layers_per_virtual_pipeline_stage": 4, "num_virtual_stages_per_pipeline_rank": 4},
     WORLD, "--num-layers-per-virtual-pipeline-stage", "error"),
    ("global-batch", {"global_batch_size": 63}, WORLD, "--global-batch-size", "error"),
    ("micro-batch-missing", {"micro_batch_size": None}, WORLD, "--micro-batch-size", "error"),
    ("seq-cp", {"context_parallel_size": 2, "seq_length": 4094, "global_batch_size": 32}, WORLD,
     "--seq-length", "error"),                                                          # 4094 % (2*2)
    ("param-gather-no-distopt", {"overlap_grad_reduce": True, "overlap_param_gather": True}, WORLD,
     "--overlap-param-gather", "error"),
    ("param-gather-no-grad-reduce", {"use_distributed_optimizer": True, "overlap_param_gather": True}, WORLD,
     "--overlap-param-gather", "error"),
    ("fp8-param-gather", {"fp8_format": "hybrid", "fp8_param_gather": True}, WORLD, "--fp8-param-gather", "error"),
    ("bf16-and-fp16", {"fp16": True}, WORLD, "--fp16", "error"),
    ("save-no-interval", {"save": "/ckpt"}, WORLD, "--save", "error"),
    ("selective-with-method", {"recompute_granularity": "selective", "recompute_method": "uniform"}, WORLD,
     "--recompute-method", "error"),
    ("full-without-method", {"recompute_granularity": "full"}, WORLD, "--recompute-granularity", "error"),
    ("sp-tp1", {"tensor_model_parallel_size": 1, "sequence_parallel": True}, WORLD, "--sequence-parallel",
     "warning"),
    ("tp-comm-overlap-no-sp", {"tp_comm_overlap": True}, WORLD, "--tp-comm-overlap", "error"),
    ("experts-ep", {"num_experts": 6, "expert_model_parallel_size": 4}, WORLD, "--expert-model-parallel-size",
     "error"),
    ("ep-tp-without-sp", {"num_experts": 8, "expert_model_parallel_size": 2}, WORLD, "--expert-model-parallel-size",
     "error"),
    ("async-save-dropped", {"save": "/ckpt", "save_interval": 100, "async_save": True}, WORLD, "--async-save",
     "error"),
    ("step-batch-schedule", {"step_batch_size_schedule": "0:32 100:64"}, WORLD, "--step-batch-size-schedule",
     "error"),
    ("bad-choice", {"recompute_granularity": "partial"}, WORLD, "--recompute-granularity", "error"),
    ("bad-choice-case", {"normalization": "rmsnorm"}, WORLD, "--normalization", "error"),
    ("bad-int", {"micro_batch_size": "one"}, WORLD, "--micro-batch-size", "error"),
    ("bad-enum", {"attention_backend": "fastest"}, WORLD, "--attention-backend", "error"),
    ("bad-moe-pattern", {"num_experts": 8, "moe_layer_freq": "__import__('os')"}, WORLD, "--moe-layer-freq",
     "error"),
]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_linter_catches_each_rule(mistake):
    _, changes, world, path, severity = mistake
    problems = megatron_args_problems(argv(**changes), world)
    hits = [p for p in problems if p.path == path]
    assert hits, f"no problem at {path}; got {[p.render() for p in problems]}"
    assert hits[0].severity == severity
    assert hits[0].fix


def test_typo_flag_is_an_error_with_the_suggestion():
    args = [a.replace("--tensor-model-parallel-size", "--tensor-model-paralel-size") for a in argv()]
    problems = megatron_args_problems(args, WORLD)
    typo = [p for p in problems if p.path == "--tensor-model-paralel-size"]
    assert len(typo) == 1 and typo[0].severity == "error"
    assert "--tensor-model-parallel-size" in typo[0].fix
    assert not [p for p in problems if p.path == "2"]  # its value was consumed with it, not reported as stray


def test_async_save_with_persistent_worker_is_fine():
    args = argv(save="/ckpt", save_interval=100, async_save=True, use_persistent_ckpt_worker=True)
    assert megatron_args_problems(args, WORLD) == []


def test_uneven_split_flags_make_indivisible_layers_legal():
    # 30 layers on pp 4: 6 + 2 x 9 + 6.
    args = argv(num_layers=30, pipeline_model_parallel_size=4, decoder_first_pipeline_num_layers=6,
                decoder_last_pipeline_num_layers=6, global_batch_size=32)
    assert megatron_args_problems(args, WORLD) == []


def test_inline_values_patterns_and_env_check():
    args = argv() + ["--attention-backend=flash", "--num-experts", "8", "--moe-layer-freq", "([0]*2+[1]*30)"]
    assert megatron_args_problems(args, WORLD) == []
    warned = megatron_args_problems(argv(), WORLD, env={})
    assert [p.path for p in warned] == ["CUDA_DEVICE_MAX_CONNECTIONS"] and warned[0].severity == "warning"
    assert megatron_args_problems(argv(), WORLD, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}) == []
    assert [p.path for p in megatron_args_problems(["--bf16=yes"] + argv(bf16=None), WORLD)] == ["--bf16"]


def test_megatron_own_parser_when_installed():
    pytest.importorskip("megatron.training", reason="Megatron-LM is not installed: its own parser is not run here")
    problems = megatron_args_problems(argv(num_attention_heads=33), WORLD)
    assert any(p.source == "megatron" for p in problems)


# ---- shell files of arguments --------------------------------------------------------------------
EXAMPLE_SCRIPT = r"""#!/bin/bash
# Runs a GPT model (the shape of Megatron-LM's examples)
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_IB_SL=1 NCCL_IB_TIMEOUT=19
GPUS_PER_NODE=8
TP=2
CHECKPOINT_PATH="/ckpt/with space"

MODEL_ARGS=(
    --num-layers 32   # transformer layers
    --hidden-size 4096
)
PAR_ARGS=( --tensor-model-parallel-size $TP --pipeline-model-parallel-size 2 )

torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    "${PAR_ARGS[@]}" \
    --micro-batch-size 1 \
    --save "$CHECKPOINT_PATH" \
    --bf16 \
    "$@" 2>&1 | tee train.log
"""


def test_read_megatron_args_file_with_arrays_exports_and_continuations(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text(EXAMPLE_SCRIPT)
    args, env = read_megatron_args_file_with_env(path)
    assert args == ["--num-layers", "32", "--hidden-size", "4096", "--tensor-model-parallel-size", "2",
                    "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1", "--save", "/ckpt/with space",
                    "--bf16"]
    assert env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_IB_SL": "1", "NCCL_IB_TIMEOUT": "19"}
    assert read_megatron_args_file(path) == args


def test_emitted_args_round_trip_through_a_shell_file(tmp_path):
    m, c, plan = _setup(*CASES[5][1:4], **CASES[5][4])
    args = megatron_args(m, c, plan, checkpoint_flags=["--save", "/ckpt dir/it's", "--save-interval", "10"])
    text = "# generated\n" + " \\\n".join(shlex.quote(a) for a in args) + "\n"
    (tmp_path / "args.sh").write_text(text)
    assert read_megatron_args_file(tmp_path / "args.sh") == args
    assert parse_shell_args("--bf16 # trailing comment\n--fp16\n")[0] == ["--bf16", "--fp16"]


def test_unreadable_args_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_megatron_args_file(tmp_path / "missing.sh")


# ---- precision: the FP8 recipe module for DeepSpeed users -----------------------------------------
def _fake_transformer_engine(monkeypatch, calls):
    class Format:
        HYBRID = "HYBRID"
        E4M3 = "E4M3"

    def recipe_class(name):  # TransformerEngine common/recipe/__init__.py's four FP8 recipe classes
        def build(**kwargs):
            calls["recipe"], calls["recipe_class"] = kwargs, name
            return ("recipe", kwargs)
        return build

    def fp8_autocast(**kwargs):
        calls["autocast"] = kwargs
        return "context"

    te = types.ModuleType("transformer_engine")
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.fp8_autocast = fp8_autocast
    common = types.ModuleType("transformer_engine.common")
    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.Format = Format
    for name in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling"):
        setattr(recipe, name, recipe_class(name))
    te.pytorch, te.common, common.recipe = pytorch, common, recipe
    for name, mod in [("transformer_engine", te), ("transformer_engine.pytorch", pytorch),
                      ("transformer_engine.common", common), ("transformer_engine.common.recipe", recipe)]:
        monkeypatch.setitem(sys.modules, name, mod)


def test_te_fp8_recipe_module(tmp_path, monkeypatch):
    plan = ParallelPlan(tp=2, precision="fp8", zero_stage=2)
    text = te_fp8_recipe_snippet(plan)
    compile(text, "te_fp8_recipe.py", "exec")
    (tmp_path / "te_fp8_recipe.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("te_fp8_recipe", None)
    module = importlib.import_module("te_fp8_recipe")  # imports with Transformer Engine absent
    if importlib.util.find_spec("transformer_engine") is None:
        with pytest.raises(ImportError, match="transformer-engine"):
            module.fp8_recipe()
    calls = {}
    _fake_transformer_engine(monkeypatch, calls)
    assert module.fp8_autocast() == "context"
    assert calls["recipe"] == {"fp8_format": "HYBRID", "amax_history_len": 1024, "amax_compute_algo": "max"}
    assert calls["recipe_class"] == "DelayedScaling"
    assert calls["autocast"]["enabled"] is True and calls["autocast"]["fp8_recipe"][0] == "recipe"
    sys.modules.pop("te_fp8_recipe", None)


@pytest.mark.parametrize(("recipe", "te_class", "fmt"), [
    ("te-current", "Float8CurrentScaling", "HYBRID"), ("te-blockwise", "Float8BlockScaling", "HYBRID"),
    ("te-mxfp8", "MXFP8BlockScaling", "E4M3")])
def test_te_fp8_recipe_module_builds_the_plans_recipe(tmp_path, monkeypatch, recipe, te_class, fmt):
    # the bundle's file for a current-scaling / block-scaled plan builds that recipe, not DelayedScaling
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="b200", num_gpus=8)
    est = estimate(model, cluster, make_plan(model, cluster, precision="fp8", fp8_recipe=recipe, engine="megatron",
                                             zero_stage=1, seq_len=2048))
    text = render_bundle(est, EmitOptions()).files["te_fp8_recipe.py"]
    (tmp_path / "te_fp8_recipe.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("te_fp8_recipe", None)
    module = importlib.import_module("te_fp8_recipe")
    calls = {}
    _fake_transformer_engine(monkeypatch, calls)
    module.fp8_autocast()
    assert calls["recipe_class"] == te_class and calls["recipe"] == {"fp8_format": fmt}
    sys.modules.pop("te_fp8_recipe", None)
    with pytest.raises(InputError, match="torchao"):
        te_fp8_recipe_snippet(ParallelPlan(precision="fp8", fp8_recipe="torchao-rowwise", engine="fsdp"))


def test_precision_summary_and_non_fp8_plans():
    assert precision_summary(ParallelPlan(precision="bf16"))["fp8"] is None
    fp16 = precision_summary(ParallelPlan(precision="fp16"))
    assert fp16["loss_scaling"]["dynamic"] and fp16["params_dtype"] == "fp16"
    fp8_plan = ParallelPlan(precision="fp8", zero_stage=1, engine="megatron")
    megatron = engine_for(fp8_plan)
    fp8 = precision_summary(fp8_plan, fp8_param_gather=megatron.fp8_param_gather(fp8_plan), fp8_how=megatron.fp8_how(fp8_plan))
    assert fp8["fp8"]["format"] == "hybrid" and fp8["fp8"]["param_gather"] and fp8["params_dtype"] == "bf16"
    with pytest.raises(InputError, match="fp8 plans"):
        te_fp8_recipe_snippet(ParallelPlan(precision="bf16"))
