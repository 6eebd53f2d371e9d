"""`autotune validate` on real-world configs (tests/fixtures/realworld, sources in its SOURCES.md): every
published, correct file passes; every broken variant gets its named problem. Issue 21: launcher arguments read as
Megatron's, quoted argument strings, AutoTP batch counts, accelerate's own FSDP templates, a string lr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.emit.shell_args import parse_shell_args
from realworld_more import BAD_MORE, GOOD_MORE  # tests/emit/ is on sys.path: the later files

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "realworld"

# file: (the job's flags, warnings the engine itself prints for the file, so expected here)
GOOD = {**GOOD_MORE,
    "megatron_gpt3_175b_distributed.sh": (["--world-size", "128"], []),
    "megatron_llama3_8b_h100_fp8.sh": (["--world-size", "8"], ["--sequence-parallel"]),  # Megatron warns too
    "megatron_pretrain_gpt_distributed_with_mp.sh": (["--world-size", "8"], []),
    "megatron_pretrain_gpt.sh": (["--world-size", "1"], []),
    "dse_hf_integration_autotp_ds_config.json": (["--hf", "--world-size", "4"], []),
    "dse_autotuning_ds_config_z2.json": (["--hf", "--world-size", "8"], []),
    "dse_autotuning_ds_config_z3.json": (["--hf", "--world-size", "8"], []),
    "hf_ds_config_zero2.json": (["--hf", "--world-size", "8"], []),
    "accelerate_deepspeed.yaml": ([], []),
    "accelerate_fsdp.yaml": ([], []),
    "accelerate_multi_gpu.yaml": ([], []),
    "accelerate_tp_hsdp.yaml": ([], []),
    "accelerate_cp.yaml": ([], []),
    "accelerate_latest_fsdp.yaml": ([], []),
    "torchtitan_llama3_8b.toml": (["--world-size", "8"], []),
    "torchtitan_llama3_70b.toml": (["--world-size", "64"], []),
    "bridge_llama32_1b_pretrain.yaml": (["--world-size", "8"], []),  # linted as accelerate before (its every section)
    "trl_alst_ulysses_4gpu.yaml": ([], ["$.deepspeed_config.seq_parallel_communication_data_type"]),  # was: "needs FSDP2"
    "accelerate_0_34_0_fp8.yaml": ([], []),  # 7 "unknown key" warnings before: launch prefixes fp8_config keys
    "accelerate_single_accelerator.yaml": ([], []),  # one process (asked for --world-size before)
    # a SageMakerConfig (3 errors before: linted as a cluster config): its debug given twice, its MY_TYPE instance
    "accelerate_0_30_0_sagemaker.yaml": ([], ["$.debug", "$.ec2_instance_type"]),
    "megatron_mamba_train.sh": ([], ["--sequence-parallel"]),  # its 800M case: tp 1, which Megatron warns about too
    "megatron_mixtral_8x7b_distributed.sh": (["--world-size", "64"], ["--sequence-parallel"]),
    "megatron_modelopt_conf_qwen3_30b_a3b.sh": (["--world-size", "8"], ["$"]),  # nothing to check, said ("no problems")
    "dse_imagenet_ds_fp16_z1_config.json": (["--world-size", "8"], ["$.cuda_visible_devices"]),  # DeepSpeed ignores it
    "dse_pipeline_parallelism_ds_config.json": (["--world-size", "8"], []),
    "ds_megatron_gpt2_bs4_zero2_offload.json": (["--world-size", "4"], ["$.zero_optimization.cpu_offload"]),
    "megatron_multimodal_pretrain_mistral_clip.sh": ([], []),  # 9 "unrecognized argument" errors before
    "trl_deepspeed_zero3.yaml": ([], []),
    # world 2 read from its batch with sp 2 ("assuming 1" and a train_batch_size error telling to write 2, before)
    "dse_autosp_config.json": (["--hf"], []),
    # DeepSpeed ignores offload_param below stage 3: a warning (an error before, and estimate refused the plan)
    "ds_hybrid_engine_config.json": (["--world-size", "8"], ["$.zero_optimization.offload_param"]),
}

# file: (the job's flags, (JSON path, words of the message) of each problem that must be there)
BAD = {**BAD_MORE,
    "megatron_gpt3_175b_distributed_head.sh": (["--world-size", "128"], [
        ("--step-batch-size-schedule", "Cannot specify both --step-batch-size-schedule and --global-batch-size"),
        ("2.4B:320", "unexpected argument '2.4B:320'")]),
    "megatron_gpt3_175b_typo.sh": (["--world-size", "128"], [("--num-layer", "unrecognized argument --num-layer")]),
    "megatron_pretrain_gpt_mp_tp3.sh": (["--world-size", "8"], [
        ("--tensor-model-parallel-size", "not divisible by total_model_size tp*pp*cp = 3*2*1")]),
    "dse_autotp_batch_per_dp_only.json": (["--world-size", "8"], [
        ("$.train_batch_size", "with AutoTP DeepSpeed counts the tp ranks too"),
        ("$.gradient_clipping", "'auto' is filled in only by the Hugging Face Trainer")]),
    "hf_ds_config_zero2_lr_string.json": (["--hf", "--world-size", "8"], [
        ("$.optimizer.params.lr", "torch.optim raises TypeError")]),
    "hf_ds_config_zero2_plain.json": (["--world-size", "8"], [
        ("$.train_batch_size", "'auto' is filled in only by the Hugging Face Trainer")]),
    "accelerate_fsdp_typo.yaml": ([], [("$.fsdp_config.fsdp_sharding_stratgy", "unknown key 'fsdp_sharding_stratgy'")]),
    "accelerate_tp_hsdp_sizes.yaml": ([], [("$.parallelism_config", "dp_replicate x dp_shard x tp x cp x sp = 16")]),
    "torchtitan_llama3_8b_tp3.toml": (["--world-size", "8"], [("$.parallelism", "8 is not divisible")]),
    "megatron_gptoss_02_train.sh": ([], [
        ("--pipeline-model-parallel-size", "Number of layers should be divisible by the pipeline-model-parallel size"),
        ("--enable-gpt-oss", "pretrain_gpt.py adds it only where nvidia-modelopt is installed")]),
    "trl_fsdp2_ac_offload_without_ac.yaml": ([], [("$.fsdp_config.fsdp_activation_checkpointing_offload",
                                                   "requires `activation_checkpointing=True`")]),
    "trl_fsdp2_ram_loading_without_sync.yaml": ([], [("$.fsdp_config.fsdp_sync_module_states",
                                                      "set --fsdp_sync_module_states to True")]),
}


def _validate(path: Path, flags: list[str], capsys) -> tuple[int, list[dict]]:
    code = main(["validate", str(path), *flags, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_the_corpus_is_complete():
    assert sorted(p.name for p in (CORPUS / "good").iterdir()) == sorted(GOOD)
    assert sorted(p.name for p in (CORPUS / "bad").iterdir()) == sorted(BAD)
    sources = (CORPUS / "SOURCES.md").read_text()
    assert all(f"| {name} |" in sources for name in [*GOOD, *BAD])


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_published_config_passes(name, capsys):
    flags, warnings = GOOD[name]
    code, problems = _validate(CORPUS / "good" / name, flags, capsys)
    assert [p for p in problems if p["severity"] == "error"] == []
    assert sorted(p["path"] for p in problems) == sorted(warnings), problems
    assert code == (1 if warnings else 0)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_broken_config_gets_its_problem(name, capsys):
    flags, expected = BAD[name]
    code, problems = _validate(CORPUS / "bad" / name, flags, capsys)
    assert code == 1
    for path, words in expected:
        assert any(p["path"] == path and words in p["message"] for p in problems), (path, words, problems)


# ---- the reader's cases, each of which read wrong before ----------------------------------------
def test_launcher_arguments_are_not_megatron_arguments():
    text = ("DISTRIBUTED_ARGS=(\n  --nproc_per_node 8\n  --master_addr localhost\n)\n"
            "MODEL=( --num-layers 2 )\ntorchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL[@]} --bf16\n")
    assert parse_shell_args(text)[0] == ["--num-layers", "2", "--bf16"]


def test_a_quoted_argument_string_is_split_as_bash_splits_it():
    text = 'GPT_ARGS="\n    --num-layers 24 \\\n    --hidden-size 1024\n"\ntorchrun pretrain_gpt.py $GPT_ARGS --fp16\n'
    assert parse_shell_args(text)[0] == ["--num-layers", "24", "--hidden-size", "1024", "--fp16"]
    # Quoted, the same expansion is one word, as bash passes it.
    assert parse_shell_args('A="--lr 1"\npython pretrain_gpt.py "$A"\n')[0] == ["--lr 1"]


def test_an_if_reads_the_branch_its_known_test_selects():
    text = ('MODE=real\nARGS=()\nif [[ "$MODE" == "mock" ]]; then\n  ARGS+=( --mock-data )\nelse\n'
            '  ARGS+=( "--data-path /d" )\nfi\nDEF=${1:-"/ckpt"}\ntorchrun pretrain_gpt.py ${ARGS[@]} --save "$DEF"\n')
    assert parse_shell_args(text)[0] == ["--data-path", "/d", "--save", "/ckpt"]


def test_integer_tests_case_and_arithmetic_read_as_bash_runs_them():
    """Megatron-LM's own examples read wrong before: `if [[ $DEBUG -eq 1 ]]` took the debug branch (examples/
    multimodal: global batch 1 for 2048), `case "$MODEL_SCALE" in` read every clause, the last winning (examples/
    mamba/train.sh: the 8B sizes for the 800M it selects), `WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))` stayed text
    (examples/gptoss/02_train.sh: "--pipeline-model-parallel-size expects an integer"), and `else GBS=256` on the
    `else` line was dropped."""
    text = ('DEBUG=0\nif [[ $DEBUG -eq 1 ]]; then BZ=1; else BZ=2048; fi\n'
            'if [ "$DEBUG" -gt 0 ]; then NW=0\nelse NW=8\nfi\n'
            'MODEL_SCALE="800M"\ncase "${MODEL_SCALE}" in\n  "800M")\n    TP=1\n    ;;\n  8B|16B) TP=4 ;;\n'
            '  *) echo "unknown"; exit 1 ;;\nesac\n'
            'case "$UNSET" in\n  a) PP=2 ;;\n  b) PP=4 ;;\nesac\n'  # an unknown word: the first clause
            'GPUS_PER_NODE=8\nNUM_NODES=2\nWORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))\nHALF=$(( (WORLD_SIZE + 1) / 2 ))\n'
            'torchrun pretrain_gpt.py --global-batch-size $BZ --num-workers $NW --tensor-model-parallel-size $TP '
            '--pipeline-model-parallel-size $PP --context-parallel-size $HALF --seed $(($RANDOM_SEED + 1)) '
            '--save $(hostname)\n')
    assert parse_shell_args(text)[0] == [
        "--global-batch-size", "2048", "--num-workers", "8", "--tensor-model-parallel-size", "1",
        "--pipeline-model-parallel-size", "2", "--context-parallel-size", "8",
        "--seed", "$(($RANDOM_SEED + 1))", "--save", "$(hostname)"]  # unknown names, commands: kept as written


def test_launch_scripts_of_megatron_deepspeeds_examples_read_as_bash_runs_them():
    """deepspeedai/Megatron-DeepSpeed@4efb479d examples_deepspeed: `echo ${run_cmd}; eval ${run_cmd}` read every flag
    twice (MoE/*.sh: about 40 "given 2 times" warnings) and its `&> log` as arguments; an option loop over the
    script's own arguments (`while [[ $# -gt 0 ]]`, universal_checkpointing/megatron_gpt/run_bf16.sh) set
    ZERO_STAGE=$2; a $(date "+%Y...") kept in a variable split into two words where it expanded; a data-preparation
    line (`python tools/preprocess_data.py`, sequence_parallel/*_32k.sh) merged into pretrain_gpt.py's arguments."""
    text = ('ZERO_STAGE=1\nwhile [[ $# -gt 0 ]]; do\n  case $1 in\n    --zero) ZERO_STAGE=$2; shift ;;\n  esac\n'
            '  shift\ndone\n'
            'stamp=$(date "+%Y.%m.%d-%H.%M.%S")\n'
            'if [ ! -f data.bin ]; then\n  python tools/preprocess_data.py --input raw.json --workers 8\nfi\n'
            'opts="--zero-stage ${ZERO_STAGE} --tensorboard-dir tb_${stamp}"\n'
            'run_cmd="deepspeed pretrain_gpt.py ${opts} &> log_${stamp}.txt"\necho ${run_cmd}\neval ${run_cmd}\n')
    assert parse_shell_args(text)[0] == ["--zero-stage", "1", "--tensorboard-dir", 'tb_$(date "+%Y.%m.%d-%H.%M.%S")']


def test_a_launch_line_inside_bash_c_is_the_job():
    """bigscience-workshop/bigscience@9e64edec train/tr11-176B-ml/tr11-176B-ml.slurm: `srun ... bash -c "$LAUNCHER
    --node_rank \\$SLURM_PROCID $CMD"` runs the job; a `python $LOAD_RATIOS_SCRIPT ...` helper line before it was
    read instead ("--micro-batch-size is required", and no model)."""
    text = ('python tools/load_ratios.py --split train --output out.txt\n'
            'export LAUNCHER="python -u -m torch.distributed.run --nproc_per_node 8 --nnodes 48"\n'
            'export CMD=" `pwd`/pretrain_gpt.py --tensor-model-parallel-size 4 --micro-batch-size 2"\n'
            'srun --jobid $SLURM_JOB_ID bash -c "$LAUNCHER --node_rank \\$SLURM_PROCID $CMD" 2>&1 | tee log.txt\n')
    assert parse_shell_args(text)[0] == ["--tensor-model-parallel-size", "4", "--micro-batch-size", "2"]


def test_a_value_a_command_prints_at_launch_is_not_checked(tmp_path, capsys):
    path = tmp_path / "run.slurm"  # an sbatch script's other name (bigscience's tr11-176B-ml.slurm)
    path.write_text("#!/bin/bash\nEP=$(($(nvidia-smi -L | wc -l) / 2))\ndeepspeed pretrain_gpt.py "
                    "--tensor-model-parallel-size 2 --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                    "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
                    "--vocab-size 1000 --bf16 --moe-expert-parallel-size $EP --deepspeed --deepspeed_config ds.json\n")
    code, problems = _validate(path, ["--world-size", "8"], capsys)
    assert [p["severity"] for p in problems if p["path"] == "--moe-expert-parallel-size"] == ["warning"], problems
    assert not [p for p in problems if p["severity"] == "error"], problems


@pytest.mark.parametrize("name, gpus, plan, said", [
    # DeepSpeed derives the micro-batch 256 / 1 / 8 = 32 (runtime/config.py:626-628): read as 1 before, "fits: yes"
    ("dse_imagenet_ds_fp16_z1_config.json", 8, {"micro_batch_size": 32, "grad_accum_steps": 1}, None),
    # no fp16 / bf16 block: DeepSpeed trains in fp32, estimated in bf16 and said (it was silent)
    ("dse_pipeline_parallelism_ds_config.json", 8, {"micro_batch_size": 8, "grad_accum_steps": 4},
     "enables neither fp16 nor bf16, so DeepSpeed trains in fp32"),
    # the deprecated cpu_offload switch is the optimizer offloaded to the CPU (zero/config.py:209-218): ignored before
    ("ds_megatron_gpt2_bs4_zero2_offload.json", 4, {"offload_optimizer": "cpu", "zero_stage": 2}, None),
    # offload_param at ZeRO-0, which DeepSpeed ignores: the plan without it, said (refused before)
    ("ds_hybrid_engine_config.json", 8, {"offload_param": "none", "zero_stage": 0, "micro_batch_size": 2},
     "offload_param at ZeRO stage 0: DeepSpeed ignores it"),
])
def test_a_published_deepspeed_config_estimates_the_job_deepspeed_runs(name, gpus, plan, said, capsys):
    code = main(["estimate", "--from", str(CORPUS / "good" / name), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb",
                 "--num-gpus", str(gpus), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)["plan"]
    assert {k: got[k] for k in plan} == plan
    assert said is None or said in err, err


@pytest.mark.parametrize("edit, plan, per_node, said", [
    # accelerate's own FSDP1 template as published: FULL_SHARD
    ({}, {"zero_stage": 3, "dp_replicate": 1}, 2, None),
    # the FSDP1 strategies (torch ShardingStrategy, by name or number), each read as fully sharded before
    ({"fsdp_sharding_strategy: FULL_SHARD": "fsdp_sharding_strategy: SHARD_GRAD_OP"}, {"zero_stage": 2}, 2, None),
    ({"fsdp_sharding_strategy: FULL_SHARD": "fsdp_sharding_strategy: 3"}, {"zero_stage": 0}, 2, None),
    ({"fsdp_sharding_strategy: FULL_SHARD": "fsdp_sharding_strategy: shard_grad_op"}, {"zero_stage": 2}, 2, None),
    # accelerate's name of torch's _HYBRID_SHARD_ZERO2 (refused before), and torch's own
    *(({"fsdp_sharding_strategy: FULL_SHARD": f"fsdp_sharding_strategy: {name}",
        "num_processes: 2": "num_processes: 16\nnum_machines: 2"}, {"zero_stage": 2, "dp_replicate": 2}, 8, None)
      for name in ("HYBRID_SHARD_ZERO2", "_HYBRID_SHARD_ZERO2")),
    ({"fsdp_sharding_strategy: FULL_SHARD": "fsdp_sharding_strategy: HYBRID_SHARD",
      "num_processes: 2": "num_processes: 16\nnum_machines: 2"}, {"zero_stage": 3, "dp_replicate": 2}, 8, None),
    # FSDP1 ignores fsdp_reshard_after_forward (the strategy, FULL_SHARD when absent, is what launch exports)
    ({"  fsdp_sharding_strategy: FULL_SHARD\n": "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"}, {"zero_stage": 3},
     2, "accelerate ignores fsdp_reshard_after_forward there"),
    # 16 processes on 4 machines: 4 a node (8, the GPU's, before); fp32 said where it was estimated as bf16 in silence
    ({"num_processes: 2": "num_processes: 16\nnum_machines: 4", "mixed_precision: 'bf16'": "mixed_precision: 'no'"},
     {"zero_stage": 3}, 4, "mixed_precision 'no' trains in fp32"),
])
def test_an_accelerate_fsdp1_config_estimates_the_job_accelerate_launches(edit, plan, per_node, said, tmp_path,
                                                                          capsys):
    text = (CORPUS / "good" / "accelerate_fsdp.yaml").read_text()
    for old, new in edit.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "fsdp.yaml"
    path.write_text(text)
    code = main(["estimate", "--from", str(path), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    assert {k: got["plan"][k] for k in plan} == plan and got["cluster"]["gpus_per_node"] == per_node
    assert said is None or said in err, err


def test_a_training_scripts_own_flags_are_its(capsys):
    """Megatron-LM's examples/gptoss/02_train.sh passes Model Optimizer's flags to pretrain_gpt.py, which adds them
    where nvidia-modelopt is installed: warnings saying so (they were parser-exit errors); a script of a model
    autotune does not model (examples/multimodal/train.py) is refused by estimate with what it trains (it was
    estimated as a GPT job at its image-embedding sequence length); a user's own script may add flags: a warning."""
    code, problems = _validate(CORPUS / "bad" / "megatron_gptoss_02_train.sh", [], capsys)
    modelopt = [p for p in problems if p["path"] in ("--export-force-local-attention", "--enable-gpt-oss")]
    assert code == 1 and len(modelopt) == 2 and all(p["severity"] == "warning" for p in modelopt), problems
    assert main(["estimate", "--from", str(CORPUS / "good" / "megatron_multimodal_pretrain_mistral_clip.sh"),
                 "--gpu", "h100-sxm-80gb"]) == 2
    assert "train.py: a vision-language model (examples/multimodal" in capsys.readouterr().err
    from autotune.emit.megatron_lint import megatron_args_problems

    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--my-flag", "1"]
    own = [p for p in megatron_args_problems(argv, 1, script="my_train.py") if p.path == "--my-flag"]
    gpt = [p for p in megatron_args_problems(argv, 1, script="pretrain_gpt.py") if p.path == "--my-flag"]
    assert [p.severity for p in own] == ["warning"] and "my_train.py may add it" in own[0].message
    assert [p.severity for p in gpt] == ["error"]


@pytest.mark.parametrize("name, flags, plan", [
    # the Hugging Face Trainer's ZeRO-2 config, its batch sizes "auto": filled as the Trainer fills them (refused
    # before: 'the DeepSpeed config has "auto" values: give the numbers', with no way to give them)
    ("hf_ds_config_zero2.json", ["--num-gpus", "8", "--global-batch", "64"],
     {"zero_stage": 2, "offload_optimizer": "cpu", "micro_batch_size": 1, "grad_accum_steps": 8}),
    # accelerate's DeepSpeed plugin with no JSON: the config accelerate builds from the block (refused before:
    # "give the ds_config.json too", which such a job has none of)
    ("trl_deepspeed_zero3.yaml", ["--global-batch", "16"],
     {"zero_stage": 3, "offload_optimizer": "none", "micro_batch_size": 1, "grad_accum_steps": 2, "dp": 8}),
    # Ulysses sequence parallelism: sequence_parallel_size 2 is the plan's cp (refused before: the batch triple)
    ("dse_autosp_config.json", ["--num-gpus", "2"], {"cp": 2, "dp": 1, "micro_batch_size": 1, "zero_stage": 0}),
])
def test_a_config_whose_batch_the_script_fills_estimates(name, flags, plan, capsys):
    code = main(["estimate", "--from", str(CORPUS / "good" / name), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb",
                 *flags, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)["plan"]
    assert {k: got[k] for k in plan} == plan
    assert '"auto" values read as the Trainer fills them' in err


@pytest.mark.parametrize("strategy", ["3", "full_shard", "HYBRID_SHARD_ZERO2", "_HYBRID_SHARD_ZERO2", "SHARD_GRAD",
                                      "6"])
def test_the_fsdp1_strategies_accelerate_takes_are_what_validate_and_estimate_take(strategy, tmp_path, capsys):
    from accelerate.utils import FullyShardedDataParallelPlugin

    try:
        FullyShardedDataParallelPlugin(sharding_strategy=strategy, fsdp_version=1)
        taken = True
    except (KeyError, ValueError):
        taken = False
    text = (CORPUS / "good" / "accelerate_fsdp.yaml").read_text()
    path = tmp_path / "fsdp.yaml"
    path.write_text(text.replace("fsdp_sharding_strategy: FULL_SHARD", f"fsdp_sharding_strategy: '{strategy}'"))
    checked = main(["validate", str(path), "--world-size", "2"])
    estimated = main(["estimate", "--from", str(path), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb"])
    err = capsys.readouterr().err
    assert (checked, estimated) == ((0, 0) if taken else (1, 2)), err
    assert taken or "fsdp_sharding_strategy" in err


def test_an_accelerate_config_accelerate_refuses_is_not_estimated(tmp_path, capsys):
    text = (CORPUS / "good" / "accelerate_fsdp.yaml").read_text().replace(
        "  fsdp_sharding_strategy: FULL_SHARD\n", "  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n")
    path = tmp_path / "fsdp2.yaml"  # sizes multiplying to 4 on 2 ranks: ParallelismConfig raises at launch
    path.write_text(text)
    assert main(["estimate", "--from", str(path), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb"]) == 0
    path.write_text(text + "parallelism_config:\n  parallelism_config_dp_shard_size: 2\n"
                           "  parallelism_config_tp_size: 2\n")
    code = main(["estimate", "--from", str(path), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb"])
    err = capsys.readouterr().err
    assert code == 2 and "= 4, the job has 2 ranks" in err and "autotune validate" in err, err
    assert "needs FSDP2" not in err  # the one problem, not a second one


def test_what_an_accelerate_config_points_to_is_checked(tmp_path, capsys):
    """accelerate's DeepSpeed template validates with the JSON it names (linted too, its "auto" values accelerate's);
    a JSON without zero_optimization (accelerate raises), a JSON not found here (a warning: it may sit where the job
    runs), and Megatron-LM's tp x pp not dividing the processes are named; each passed before."""
    template = CORPUS / "good" / "accelerate_deepspeed.yaml"
    code, problems = _validate(template, [], capsys)
    assert code == 0 and problems == []
    ds = json.loads((CORPUS / "deepspeed_config_templates" / "zero_stage1_config.json").read_text())
    del ds["zero_optimization"]
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    yaml_text = template.read_text().replace("../deepspeed_config_templates/zero_stage1_config.json", "ds.json")
    (tmp_path / "a.yaml").write_text(yaml_text)
    code, problems = _validate(tmp_path / "a.yaml", [], capsys)
    assert code == 1 and any("has no zero_optimization block" in p["message"] for p in problems), problems
    (tmp_path / "b.yaml").write_text(yaml_text.replace("ds.json", "elsewhere.json"))
    code, problems = _validate(tmp_path / "b.yaml", [], capsys)
    assert [(p["severity"], "is not here" in p["message"]) for p in problems] == [("warning", True)], problems
    (tmp_path / "m.yaml").write_text("distributed_type: MEGATRON_LM\nnum_processes: 4\nmegatron_lm_config:\n"
                                     "  megatron_lm_tp_degree: 3\n  megatron_lm_pp_degree: 2\n")
    code, problems = _validate(tmp_path / "m.yaml", [], capsys)
    assert code == 1 and any("3 x 2 does not divide the 4 processes" in p["message"] for p in problems), problems


def test_a_multi_gpu_accelerate_config_estimates_as_ddp(capsys):
    """accelerate's multi-GPU template (DistributedDataParallel), the most common accelerate config, was refused by
    estimate ("autotune reads FSDP and DeepSpeed accelerate configs"): now unsharded data parallelism, said."""
    code = main(["estimate", "--from", str(CORPUS / "good" / "accelerate_multi_gpu.yaml"), "--model", "llama3-8b",
                 "--gpu", "h100-sxm-80gb", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    assert (got["plan"]["engine"], got["plan"]["zero_stage"], got["plan"]["dp"]) == ("fsdp", 0, 2)
    assert "distributed_type MULTI_GPU: DistributedDataParallel" in err
    assert not got["memory"]["fits"]  # every rank holds the 8B model's fp32 weights, gradients and Adam states


def test_a_bridge_override_takes_the_library_recipes_ddp_where_it_is_silent(capsys):
    """Bridge's tutorial override (no ddp block) runs on a library recipe, whose ddp has the distributed optimizer and
    overlapped gradient reduction (recipes/common.py _pretrain_common): read as Megatron-core's defaults before
    (mcore-ddp, its optimizer states unsharded); now the recipe's, said."""
    code = main(["estimate", "--from", str(CORPUS / "good" / "bridge_llama32_1b_pretrain.yaml"), "--model",
                 "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)["plan"]
    assert (got["zero_stage"], got["overlap_comm"]) == (1, True)
    assert "the base recipe's ddp use_distributed_optimizer and overlap_grad_reduce" in err


def test_accelerate_tensor_parallelism_has_no_sequence_parallel_norms(capsys):
    """accelerate's TP is the model's transformers TP plan (colwise / rowwise linears only: LlamaConfig
    base_model_tp_plan in transformers 5.25): its tp_hsdp.yaml was planned with sequence parallelism (norms and their
    activations split over the TP ranks), which that run does not have."""
    from transformers import LlamaConfig

    assert set(LlamaConfig.base_model_tp_plan.values()) == {"colwise", "rowwise"}
    code = main(["estimate", "--from", str(CORPUS / "good" / "accelerate_tp_hsdp.yaml"), "--model", "llama3-8b",
                 "--gpu", "h100-sxm-80gb", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["tp"], plan["sequence_parallel"]) == (2, False)


def test_a_key_given_twice_is_read_as_accelerate_reads_it(tmp_path, capsys):
    """accelerate's own tests/test_configs/0_30_0_sagemaker.yaml gives `debug` twice; accelerate's loader
    (yaml.safe_load) keeps the last value: a warning, where it was refused as "not valid YAML" (exit 2)."""
    text = (CORPUS / "good" / "accelerate_fsdp.yaml").read_text().replace("num_processes: 2",
                                                                          "num_processes: 4\nnum_processes: 2")
    (tmp_path / "twice.yaml").write_text(text)
    code, problems = _validate(tmp_path / "twice.yaml", [], capsys)
    assert code == 1 and [(p["path"], p["severity"]) for p in problems] == [("$.num_processes", "warning")]
    assert "given twice: accelerate's loader keeps the last value" in problems[0]["message"]
    assert main(["validate", str(tmp_path / "twice.yaml")]) == 1 and "world size 2" in capsys.readouterr().out
