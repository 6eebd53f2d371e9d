"""Megatron-LM arguments checked: the linter catches each validate_args rule (one argv per mistake) and passes what
Megatron-LM accepts; shell files of arguments (arrays, exports, continuations) read back."""

import shlex

import pytest

from autotune.api import make_plan
from autotune.emit.megatron import (
    megatron_args,
    megatron_args_problems,
    parse_shell_args,
    read_megatron_args_file,
    read_megatron_args_file_with_env,
)
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset


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
    ("router-dtype-many-experts", {"num_experts": 64}, WORLD, "--num-experts", "warning"),
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


def test_few_experts_or_fp32_routing_are_fine():
    """Megatron-core's warning starts at 32 experts (transformer_config.py:2794-2802); fp32 routing silences it."""
    assert megatron_args_problems(argv(num_experts=16), WORLD) == []
    assert megatron_args_problems(argv(num_experts=64, moe_router_dtype="fp32"), WORLD) == []


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
    m, c = load_model_preset("deepseek-v3"), load_cluster(gpu="h100-sxm-80gb", num_gpus=2048)
    plan = make_plan(m, c, tp=2, ep=64, global_batch_size=4096, zero_stage=1, engine="megatron", precision="fp8")
    args = megatron_args(m, c, plan, checkpoint_flags=["--save", "/ckpt dir/it's", "--save-interval", "10"])
    text = "# generated\n" + " \\\n".join(shlex.quote(a) for a in args) + "\n"
    (tmp_path / "args.sh").write_text(text)
    assert read_megatron_args_file(tmp_path / "args.sh") == args
    assert parse_shell_args("--bf16 # trailing comment\n--fp16\n")[0] == ["--bf16", "--fp16"]


def test_unreadable_args_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_megatron_args_file(tmp_path / "missing.sh")
