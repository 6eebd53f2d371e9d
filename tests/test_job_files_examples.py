"""`estimate --from` on job files as their engines' own examples write them (Megatron-LM's example scripts, an
accelerate config, a torchtitan TOML): what the engine runs read as it runs it, and what --from does not apply said."""

from __future__ import annotations

import json

from test_job_files import GPU, ROOT, run  # tests/ is on sys.path: the --from tests' CLI runner

# Megatron-LM's own examples/llama/train_llama3_8b_h100_fp8.sh (core_v0.19) in its shape: sizes in variables, the
# arguments in bash arrays, --sequence-parallel beside TP_SIZE=1 (which validate_args turns off, arguments.py
# :1433-1439): estimate --from refused it ("sequence parallelism needs tp > 1") and validate asked for --world-size
# its launch line states.
MEGATRON_EXAMPLE = r"""#!/bin/bash
GPUS_PER_NODE=8
NUM_NODES=1
TP_SIZE=1
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192
    --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 1000000
    --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights
)
TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 128 --bf16
    --tensor-model-parallel-size $TP_SIZE
    --sequence-parallel  # Always enable sequence parallelism with TP_SIZE=2
    --use-distributed-optimizer
    --tokenizer-type NullTokenizer --vocab-size 128256 --mock-data
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]}
"""


def test_nodes_left_to_slurm_take_num_gpus(tmp_path, capsys):
    """NNODES=${SLURM_NNODES:-"1"} (Megatron-LM's Mixtral example): the file leaves the node count to the run's
    environment, so --num-gpus 64 is the job's, not a disagreement with the default's 8 GPUs (it was refused:
    "--num-gpus 64 but the files state 8 GPUs"); a node count the file sets itself still disagrees."""
    path = tmp_path / "train.sh"
    path.write_text(MEGATRON_EXAMPLE.replace("NUM_NODES=1", 'NUM_NODES=${SLURM_NNODES:-"1"}'))
    code, out, err = run(["estimate", "--from", path, *GPU, "--num-gpus", "64", "--json"], capsys)
    assert code == 0 and 'its nodes are ${SLURM_NNODES:-"1"} at run time: --num-gpus 64 taken' in err, err
    assert json.loads(out)["plan"]["dp"] == 64
    code, out, _ = run(["estimate", "--from", path, *GPU, "--json"], capsys)  # the default: one node of 8
    assert code == 0 and json.loads(out)["plan"]["dp"] == 8
    path.write_text(MEGATRON_EXAMPLE)
    code, _, err = run(["estimate", "--from", path, *GPU, "--num-gpus", "64"], capsys)
    assert code == 2 and "--num-gpus 64 but the files state 8 GPUs" in err, err


def test_megatrons_own_example_reads_with_sequence_parallel_off_at_tp_1(tmp_path, capsys):
    path = tmp_path / "train_llama3_8b_h100_fp8.sh"
    path.write_text(MEGATRON_EXAMPLE)
    code, out, err = run(["estimate", "--from", path, *GPU, "--json"], capsys)
    assert code == 0 and "--sequence-parallel at tensor-parallel size 1: Megatron turns it off, read so" in err, err
    plan = json.loads(out)["plan"]
    assert (plan["tp"], plan["dp"], plan["sequence_parallel"]) == (1, 8, False)
    code, out, err = run(["validate", path], capsys)  # the world size its launch line states, as --from reads it
    assert code == 1 and "no --world-size: assuming 8" in err, err
    assert "sequence parallelism with tensor-model-parallel size 1: Megatron silently disables it" in out
    assert "0 error(s), 1 warning(s) for world size 8" in out


def test_plan_flags_the_files_state_otherwise_are_said_not_applied(capsys):
    """`estimate --from FILE --zero 2 --precision fp16` estimated the file's ZeRO-3 bf16 job and said nothing of the
    flags ("flags fill what the files do not state"); now stderr names each one not applied. Flags the files leave
    to them (a DeepSpeed config's tp, its recompute) are applied, and not named."""
    accel = ROOT / "tests" / "fixtures" / "realworld" / "good" / "accelerate_tp_hsdp.yaml"
    code, out, err = run(["estimate", "--from", accel, "--model", "llama3-8b", *GPU, "--zero", "2", "--precision",
                          "fp16", "--json"], capsys)
    assert code == 0 and json.loads(out)["plan"]["zero_stage"] == 3
    assert "not applied, the files state the job otherwise: --zero 2 (the files: 3), --precision fp16 (the files: " \
           "bf16)" in err, err
    ds = ROOT / "tests" / "fixtures" / "realworld" / "good" / "hf_ds_config_zero2.json"
    code, out, err = run(["estimate", "--from", ds, "--model", "llama3-8b", *GPU, "--num-gpus", "8", "--tp", "2",
                          "--recompute", "full", "--json"], capsys)
    assert code == 0 and (json.loads(out)["plan"]["tp"], json.loads(out)["plan"]["recompute"]) == (2, "full")
    assert "not applied" not in err


def test_a_model_the_files_name_that_no_preset_is_is_named(tmp_path, capsys):
    """torchtitan's qwen3_32b.toml names its model (qwen3, flavor 32B), which no preset is: the refusal said "does not
    state it"; now it names the model and flavor read, and --model."""
    toml = (ROOT / "tests" / "fixtures" / "realworld" / "good" / "torchtitan_llama3_8b.toml").read_text()
    path = tmp_path / "qwen3_32b.toml"
    path.write_text(toml.replace('name = "llama3"', 'name = "qwen3"').replace('flavor = "8B"', 'flavor = "32B"'))
    code, _, err = run(["estimate", "--from", path, *GPU, "--num-gpus", "8"], capsys)
    assert code == 2 and "torchtitan model 'qwen3' flavor '32B' is not a preset autotune knows: give --model" in err
    assert "does not state it" not in err
