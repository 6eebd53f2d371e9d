"""`--from CHECKPOINT_FOLDER` refusals (autotune.job_checkpoint): reading a checkpoint runs no code from it (a
payload that copies a file does nothing, one naming a module torch blocks is refused, in a pickle or in a
torch.distributed.checkpoint index); damaged and foreign folders exit 2 naming the problem and the way out."""
from __future__ import annotations

import os
import pickle
import shutil
import sys

import pytest
import torch
from checkpoint_helpers import (DS_CONFIG, ENUMS, Payload, deepspeed_save, estimate, megatron_args, megatron_enums,
                                save_megatron, save_torch_dist, trainer_args)


def test_reading_a_checkpoint_runs_no_code_from_it(tmp_path, capsys, monkeypatch):
    backend = megatron_enums(monkeypatch)
    source, copied = tmp_path / "a", tmp_path / "b"
    source.write_text("x")
    hook = Payload(shutil.copyfile, str(source), str(copied))  # a callable torch's loader does not block by name
    save_megatron(tmp_path / "save", {"args": megatron_args(backend), "hook": hook}, "common.pt")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 0, got
    assert not copied.exists()  # torch.load(weights_only=False) would have copied the file
    assert got["plan"]["tp"] == 8


def test_a_checkpoint_naming_a_blocked_module_is_refused_unloaded(tmp_path, capsys, monkeypatch):
    backend = megatron_enums(monkeypatch)
    marker = tmp_path / "ran"
    save_megatron(tmp_path / "save", {"args": megatron_args(backend), "hook": Payload(os.system, f"touch {marker}")},
                   "common.pt")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, err = estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 2 and "names posix.system" in err and "was not loaded" in err, err
    assert not marker.exists()


def _empty(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "notes.txt").write_text("x")


def _tracker_to_nothing(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest_checkpointed_iteration.txt").write_text("500")


def _truncated(tmp_path):
    save = tmp_path / "ck" / "iter_0000100"
    save.mkdir(parents=True)
    (save / "common.pt").write_bytes(b"PK\x03\x04 not the rest")


def _no_args(tmp_path):
    save_megatron(tmp_path / "ck", {"iteration": 100}, "common.pt")


def _latest_to_nothing(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest").write_text("global_step7")
    (tmp_path / "ck" / "global_step5").mkdir()
    torch.save({}, tmp_path / "ck" / "global_step5" / "mp_rank_00_model_states.pt")


def _tracker_of_thousands_of_digits(tmp_path):  # int() refuses strings over 4,300 digits
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest_checkpointed_iteration.txt").write_text("9" * 5000)


def _latest_empty(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest").write_text("")


class TrainingArguments:  # a stand-in for transformers' class: its attributes, pickled as the Trainer saves them
    def __init__(self, **attributes):
        self.__dict__.update(attributes)


def _trainer_args_of_zero_batch(tmp_path):
    (tmp_path / "ck").mkdir()
    torch.save(TrainingArguments(per_device_train_batch_size=0, gradient_accumulation_steps=1),
               tmp_path / "ck" / "training_args.bin")


@pytest.mark.parametrize("make, words", [
    (_tracker_of_thousands_of_digits, "names '9999999999"),
    (_latest_empty, "latest: names '', which is no folder in"),
    (_trainer_args_of_zero_batch, "TrainingArguments.per_device_train_batch_size is 0, not a positive whole number"),
    (_empty, "a folder without a Megatron-LM, DeepSpeed or Trainer checkpoint"),
    (_tracker_to_nothing, "names '500', which is no save in"),
    (_truncated, "does not read as a torch checkpoint"),
    (_no_args, "a Megatron-LM checkpoint without its arguments ('args'): give the job's argument file"),
    (_latest_to_nothing, "names 'global_step7', which is no folder in"),
])
def test_a_bad_checkpoint_folder_exits_2_naming_it(tmp_path, capsys, make, words):
    make(tmp_path)
    code, err = estimate(capsys, "--from", str(tmp_path / "ck"), "--model", "llama3-8b", "--num-gpus", "8")
    assert code == 2 and words in err and "Traceback" not in err, err


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_torch_dist_save_reads_and_its_index_runs_no_code(tmp_path, capsys, monkeypatch):
    backend = megatron_enums(monkeypatch)
    save_torch_dist(tmp_path / "save", {"args": megatron_args(backend), "iteration": 100})
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 0, got
    assert (got["plan"]["tp"], got["plan"]["pp"], got["plan"]["dp"]) == (8, 4, 2)
    marker = tmp_path / "ran"
    # torch's own FileSystemReader takes the .metadata index with pickle.load: a hostile index would run
    (tmp_path / "save" / "iter_0000100" / ".metadata").write_bytes(
        pickle.dumps(Payload(os.system, f"touch {marker}")))
    code, err = estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 2 and ".metadata: names posix.system" in err and "was not loaded" in err, err
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_trainer_deepspeed_job_is_judged_by_the_hf_engines_rules(tmp_path, capsys):
    # the Trainer drives DeepSpeed as the hf engine, which has no tensor parallelism: --tp 2 over its checkpoint is
    # refused with that rule (the engine was once set on the finished plan, past the rules)
    folder = tmp_path / "checkpoint-20"
    deepspeed_save(folder, {"ds_config": DS_CONFIG | {"train_batch_size": 32, "zero_optimization": {"stage": 2}},
                            "dp_world_size": 4, "mp_world_size": 1})
    trainer_args(folder, per_device_train_batch_size=2, gradient_accumulation_steps=8, bf16=True,
                 deepspeed={"zero_optimization": {"stage": 2}})
    code, err = estimate(capsys, "--from", str(folder), "--tp", "2", "--seq-len", "4096")
    assert code == 2 and "Hugging Face Trainer / accelerate (DeepSpeed backend): no tensor parallelism" in err, err
