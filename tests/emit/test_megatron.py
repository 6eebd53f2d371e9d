"""Megatron-LM arguments: every emitted flag exists with a valid value, the plan's dimensions become their flags,
what Megatron-LM cannot run is refused; the Megatron-DeepSpeed form. The linter and shell files of arguments are in
test_megatron_lint.py, the FP8 recipe module in test_megatron_fp8_recipe.py."""


import dataclasses

import pytest

from autotune.api import make_plan
from autotune.emit.megatron import (
    MEGATRON_DEEPSPEED_FLAGS,
    MEGATRON_NCCL_DEFAULTS,
    megatron_args,
    megatron_args_problems,
    megatron_deepspeed_args,
    megatron_env,
    megatron_flag_table,
)
from autotune.emit.options import EmitOptions
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
    # megatron-core's NullTokenizer holds exactly --vocab-size (its EOD the last id): the model's 128256.
    assert "--vocab-size 128256" in joined

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


def test_op_fuser_switch_exactly_on_the_sync_free_moe_path():
    """Megatron asserts the op fuser's support, false for gated experts without NVTE_CUTEDSL_FUSED_GROUPED_MLP."""
    graphed = ParallelPlan(engine="megatron", dp=8, ep=8, seq_len=4096, micro_batch_size=4, global_batch_size=512,
                           precision="fp8", fp8_recipe="te-mxfp8", cuda_graph="full-iteration",
                           moe_dispatcher="flex-hybridep")
    assert megatron_env(graphed).get("NVTE_CUTEDSL_FUSED_GROUPED_MLP") == "1"
    for other in (dataclasses.replace(graphed, moe_dispatcher="alltoall"),
                  dataclasses.replace(graphed, cuda_graph="transformer_engine", cuda_graph_scope=("moe_router",))):
        assert "NVTE_CUTEDSL_FUSED_GROUPED_MLP" not in megatron_env(other)


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


def test_megatron_deepspeed_splits_experts_over_tp_as_the_plan_does():
    """The plan splits each expert tp ways (etp = tp); the fork builds experts whole on each TP rank unless
    --enable-expert-tensor-parallelism (megatron/core/tensor_parallel/layers.py:529-531)."""
    mixtral = load_model_preset("mixtral-8x7b")
    c = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = ParallelPlan(tp=2, dp=8, ep=4, global_batch_size=16, zero_stage=1, engine="megatron-deepspeed")
    assert "--enable-expert-tensor-parallelism" in megatron_deepspeed_args(mixtral, c, plan, None, "ds.json")
    flat = megatron_deepspeed_args(mixtral, c, plan.with_(tp=1, dp=16), None, "ds.json")
    assert "--enable-expert-tensor-parallelism" not in flat


@pytest.mark.parametrize("seq_len, rows", [(2048, "2050"), (4096, "4096")])
def test_a_position_offset_is_in_the_table_megatron_builds(seq_len, rows):
    """OPT's table: 2048 positions after 2 offset rows. Megatron's --max-position-embeddings is its table's rows: the
    offset's included, so the job holds the parameters counted; a sequence past the 2048 positions is refused."""
    from autotune.emit.megatron_model_flags import shape_flags
    from autotune.specs.model import ModelSpec

    model = ModelSpec(name="opt-like", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                      vocab_size=128, max_position_embeddings=2048, position_offset=2, linear_bias=True)
    problems: list[str] = []
    args = shape_flags(model, ParallelPlan(engine="megatron", seq_len=seq_len), problems)
    assert args[args.index("--max-position-embeddings") + 1] == rows
    assert bool([p for p in problems if "exceeds the learned position table (2048 rows)" in p]) is (seq_len > 2048)
