"""`autotune validate FILE --gpu GPU`: the job a file states (Megatron-LM arguments, a torchtitan config, a
Megatron-LM checkpoint folder, ...) checked against the GPU's memory by the ledger, as `estimate --from FILE --gpu`
reads it (autotune.lint.job_memory_problems); a DeepSpeed JSON, which states no model, with --model as before."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_helpers import (DS_CONFIG, PHI3_CONFIG, deepspeed_save, megatron_args, megatron_enums, save_megatron,
                                trainer_args)

from autotune.cli import main

ROOT = Path(__file__).resolve().parents[1]
ARGS = ROOT / "examples" / "jobs" / "megatron_args_llama3_70b.sh"  # Llama-3-70B, tp 8 x pp 4 x vpp 4, 64 GPUs


def validate(capsys, *argv) -> tuple[int, str, str]:
    code = main(["validate", *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def estimate_total_gib(capsys, gpu: str) -> float:
    assert main(["estimate", "--from", str(ARGS), "--gpu", gpu, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["memory"]["total"] / 2**30


def test_an_argument_file_is_checked_against_the_gpus_memory(capsys):
    code, out, err = validate(capsys, ARGS, "--world-size", "64", "--gpu", "h100-sxm-80gb")
    assert code == 0 and "no problems for world size 64" in out, out + err
    code, out, _ = validate(capsys, ARGS, "--world-size", "64", "--gpu", "a100-40gb", "--json")
    problems = json.loads(out)
    assert code == 1 and [(p["source"], p["path"]) for p in problems] == [("memory", "(the plan)")], problems
    need = estimate_total_gib(capsys, "a100-40gb")  # the ledger estimate --from gives: the same number
    assert f"llama3-70b on 64 x a100-40gb needs {need:.2f} GiB per GPU" in problems[0]["message"], problems
    assert f"autotune plan --from {ARGS} --gpu a100-40gb" in problems[0]["fix"]


def test_seq_len_checks_an_argument_files_job_at_another_sequence(capsys):
    """--seq-len over a file that states its own: the job at that sequence, as `estimate --from` takes it (it was
    dropped in silence: the 8,192 the file states was checked)."""
    code, out, _ = validate(capsys, ARGS, "--world-size", "64", "--gpu", "h100-sxm-80gb", "--seq-len", "32768")
    assert main(["estimate", "--from", str(ARGS), "--gpu", "h100-sxm-80gb", "--seq-len", "32768", "--json"]) == 0
    need = json.loads(capsys.readouterr().out)["memory"]["total"] / 2**30
    assert code == 1 and f"needs {need:.2f} GiB per GPU" in out and need > 80, out
    assert f"autotune plan --from {ARGS} --seq-len 32768 --gpu h100-sxm-80gb" in out


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_megatron_save_is_checked_against_the_gpus_memory(tmp_path, capsys, monkeypatch):
    backend = megatron_enums(monkeypatch)
    save_megatron(tmp_path / "meg", {"args": megatron_args(backend)}, "common.pt")
    assert validate(capsys, tmp_path / "meg", "--gpu", "h100-sxm-80gb")[0] == 0
    code, out, _ = validate(capsys, tmp_path / "meg", "--gpu", "a100-40gb")
    assert code == 1 and "does not fit in GPU memory: llama3-70b on 64 x a100-40gb" in out, out


def test_what_the_memory_check_needs_is_named(tmp_path, capsys):
    code, _, err = validate(capsys, ARGS, "--world-size", "64", "--model", "llama3-70b")
    assert code == 2 and "the memory check needs --gpu" in err
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=8\nnode2 slots=8\n")
    code, _, err = validate(capsys, hostfile, "--gpu", "h100-sxm-80gb")
    assert code == 2 and "the memory check (--gpu) reads a file that states a job" in err
    ds = tmp_path / "ds_config.json"
    ds.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 1, "bf16": {"enabled": True}}))
    code, out, err = validate(capsys, ds, "--gpu", "h100-sxm-80gb")  # no model: linted, its memory not checked
    assert code == 0 and "no problems for world size 8" in out
    assert "the memory check of a DeepSpeed or accelerate config needs --model (it states no model): not made" in err


def test_an_accelerate_config_is_checked_with_the_model_it_leaves_out(capsys):
    """An accelerate config states the plan (FSDP, 1 process, fp32 here) and not the model: with --model and
    --seq-len, its job is checked as `estimate --from CONFIG --model M --seq-len S` reads it."""
    config = ROOT / "tests" / "fixtures" / "realworld" / "good" / "accelerate_latest_fsdp.yaml"
    code, out, _ = validate(capsys, config, "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--seq-len", "2048")
    assert code == 1 and "llama3-8b on 1 x h100-sxm-80gb needs" in out, out  # 8B in fp32 on one GPU
    assert f"autotune plan --from {config} --model llama3-8b --seq-len 2048 --gpu h100-sxm-80gb" in out
    code, out, err = validate(capsys, config, "--model", "tiny-gpt", "--gpu", "h100-sxm-80gb")
    assert code == 0 and "no problems for world size 1" in out, out + err


def test_a_file_with_errors_is_not_memory_checked(capsys):
    code, out, err = validate(capsys, ARGS, "--world-size", "48", "--gpu", "a100-40gb")  # tp 8 x pp 4 into 48: no
    assert code == 1 and "is not divisible by total_model_size" in out and "does not fit" not in out
    assert "memory check skipped: fix the errors first" in err


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_trainer_checkpoint_gets_the_memory_check_alone(tmp_path, capsys):
    """No config file in it to lint: with --gpu, the job its TrainingArguments and config.json state (Phi-3-mini,
    FSDP over its one process, bf16) is checked; without, the refusal names both ways."""
    trainer_args(tmp_path / "hf", per_device_train_batch_size=2, bf16=True, fsdp="full_shard")
    capsys.readouterr()  # transformers' own warnings while the test builds the arguments: not autotune's output
    code, out, err = validate(capsys, tmp_path / "hf", "--gpu", "b200", "--seq-len", "2048")
    assert code == 0 and "no problems for world size 1" in out, out + err
    assert "a Trainer checkpoint holds no config file: its job's memory check alone" in err
    code, out, _ = validate(capsys, tmp_path / "hf", "--gpu", "a100-40gb", "--seq-len", "2048")
    assert code == 1 and "does not fit in GPU memory: phi3" in out, out
    assert "--seq-len 2048 --gpu a100-40gb" in out  # the plan --from command that lists what fits
    code, _, err = validate(capsys, tmp_path / "hf")
    assert code == 2 and f"autotune validate {tmp_path / 'hf'} --gpu GPU" in err


def test_a_deepspeed_save_is_checked_with_the_model_beside_it(tmp_path, capsys):
    """A DeepSpeed save (a Trainer's checkpoint-N keeps config.json beside its tag folder) needs no --model; without
    one beside it, stderr says what the check lacks."""
    deepspeed_save(tmp_path / "ck", {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    code, out, err = validate(capsys, tmp_path / "ck", "--gpu", "h100-sxm-80gb")
    assert code == 0 and "memory check not made" in err and "--model" in err, out + err
    (tmp_path / "ck" / "config.json").write_text(json.dumps(PHI3_CONFIG))
    code, out, err = validate(capsys, tmp_path / "ck", "--gpu", "h100-sxm-80gb", "--seq-len", "2048")
    assert code == 0 and "no problems for world size 4" in out and "memory check not made" not in err, out + err
    code, out, _ = validate(capsys, tmp_path / "ck", "--gpu", "l40s", "--seq-len", "32768")
    assert code == 1 and "does not fit in GPU memory: phi3" in out, out


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_megatron_deepspeed_save_is_checked_as_estimate_from_reads_it(tmp_path, capsys, monkeypatch):
    """A Megatron-DeepSpeed save's memory check reads its job as `estimate --from` does, with or without --model:
    the saved arguments' sequence (8,192), not validate's DeepSpeed-JSON default of 4,096, which it used to check
    (224 GiB against estimate's 251), and their tp 4, not --tp's 1, under --model."""
    import sys

    from checkpoint_helpers import ENUMS

    backend = megatron_enums(monkeypatch)
    args = megatron_args(backend, deepspeed=True, deepspeed_config="ds_config.json", zero_stage=1,
                         tensor_model_parallel_size=4, pipeline_model_parallel_size=1,
                         num_layers_per_virtual_pipeline_stage=None, virtual_pipeline_model_parallel_size=None,
                         use_distributed_optimizer=False, world_size=32, normalization="rmsnorm")
    ds = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 64,
          "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}
    deepspeed_save(tmp_path / "ck", {"ds_config": ds, "dp_world_size": 8, "mp_world_size": 4, "args": args})
    monkeypatch.delitem(sys.modules, ENUMS)
    for model in ([], ["--model", "llama3-70b"]):
        assert main(["estimate", "--from", str(tmp_path / "ck"), "--gpu", "h100-sxm-80gb", *model, "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["plan"]["seq_len"] == 8192 and got["plan"]["tp"] == 4
        code, out, _ = validate(capsys, tmp_path / "ck", "--gpu", "h100-sxm-80gb", *model)
        assert code == 1 and f"needs {got['memory']['total'] / 2**30:.2f} GiB per GPU" in out, out
        assert "--seq-len" not in out  # the fix names no sequence the save does not state
