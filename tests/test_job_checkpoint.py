"""`--from CHECKPOINT_FOLDER` (autotune.job_checkpoint): the job a Megatron-LM, Megatron-Bridge, DeepSpeed or Hugging
Face Trainer checkpoint states, in the layouts and formats the engines write (their own savers run in
tests/test_job_checkpoint_real.py; refusals and hostile files: tests/test_job_checkpoint_refusals.py)."""
from __future__ import annotations

import argparse
import json
import shutil
import sys

import pytest
import torch
from checkpoint_helpers import (DS_CONFIG, ENUMS, PHI3_CONFIG, deepspeed_save, estimate, megatron_args, megatron_enums,
                                save_megatron, trainer_args)

from autotune.cli import main
from autotune.errors import InputError
from autotune.job_checkpoint import inspect_path, locate, namespace_argv, read_checkpoint


@pytest.mark.parametrize("layout", ["torch", "common.pt"])
def test_a_megatron_checkpoint_states_its_plan_world_size_and_model(tmp_path, capsys, monkeypatch, layout):
    backend = megatron_enums(monkeypatch)
    save_megatron(tmp_path, {"args": megatron_args(backend), "iteration": 100, "checkpoint_version": 3.0}, layout)
    monkeypatch.delitem(sys.modules, ENUMS)  # autotune reads without Megatron
    code, got = estimate(capsys, "--from", str(tmp_path))
    assert code == 0, got
    plan = got["plan"]
    assert (plan["tp"], plan["pp"], plan["vpp"], plan["dp"]) == (8, 4, 4, 2)  # dp from args.world_size 64
    assert (plan["micro_batch_size"], plan["global_batch_size"], plan["seq_len"]) == (1, 512, 8192)
    assert plan["zero_stage"] == 1 and plan["sequence_parallel"] and plan["recompute"] == "selective"
    assert plan["precision"] == "bf16" and plan["ep"] == 1 and plan["flash_attention"]  # a dense model: no MoE
    assert got["model"]["name"] == "llama3-70b"


def test_megatron_enums_in_the_arguments_are_read_by_value(tmp_path, capsys, monkeypatch):
    backend = megatron_enums(monkeypatch)
    save_megatron(tmp_path, {"args": megatron_args(backend, attention_backend=backend.unfused)}, "common.pt")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = estimate(capsys, "--from", str(tmp_path / "iter_0000100"))  # one save's folder, no tracker
    assert code == 0, got
    assert got["plan"]["flash_attention"] is False  # --attention-backend unfused


def test_a_trainer_deepspeed_checkpoint_states_its_config_world_size_and_model(tmp_path, capsys):
    folder = tmp_path / "checkpoint-20"
    deepspeed_save(folder, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1}, zero3=True)
    (folder / "config.json").write_text(json.dumps(PHI3_CONFIG))
    code, got = estimate(capsys, "--from", str(folder), "--seq-len", "4096")
    assert code == 0, got
    plan = got["plan"]
    assert (plan["zero_stage"], plan["micro_batch_size"], plan["dp"], plan["global_batch_size"]) == (3, 2, 4, 64)
    assert got["model"]["spec"]["num_layers"] == 32 and got["model"]["spec"]["hidden_size"] == 3072
    assert plan["engine"] == "deepspeed"


@pytest.mark.parametrize("release, said", [("0.19.8", False), ("0.14.4", True)])
def test_a_deepspeed_checkpoint_of_another_release_says_so(tmp_path, capsys, release, said):
    deepspeed_save(tmp_path, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1, "ds_version": release})
    code = main(["estimate", "--from", str(tmp_path), "--model", "phi3-mini", "--gpu", "h100-sxm-80gb"])
    assert code == 0
    err = capsys.readouterr().err
    assert ("saved by DeepSpeed 0.14.4; estimated as DeepSpeed 0.19.8" in err) is said, err


def test_a_ds_config_given_as_a_path_is_read_where_it_is(tmp_path, capsys):
    (tmp_path / "ds_config.json").write_text(json.dumps(DS_CONFIG))
    deepspeed_save(tmp_path / "save", {"ds_config": str(tmp_path / "ds_config.json"), "dp_world_size": 4,
                                        "mp_world_size": 1})
    code, got = estimate(capsys, "--from", str(tmp_path / "save"), "--model", "phi3-mini", "--seq-len", "4096")
    assert code == 0, got
    assert got["plan"]["zero_stage"] == 3 and got["plan"]["dp"] == 4
    (tmp_path / "ds_config.json").unlink()
    code, err = estimate(capsys, "--from", str(tmp_path / "save"), "--model", "phi3-mini")
    assert code == 2 and "its DeepSpeed config was the file" in err and "give that ds_config.json to --from" in err


def test_a_megatron_deepspeed_checkpoint_reads_its_arguments_beside_deepspeeds_config(tmp_path, capsys, monkeypatch):
    backend = megatron_enums(monkeypatch)
    args = megatron_args(backend, deepspeed=True, zero_stage=1, tensor_model_parallel_size=4,
                         pipeline_model_parallel_size=1, num_layers_per_virtual_pipeline_stage=None,
                         virtual_pipeline_model_parallel_size=None, use_distributed_optimizer=False, world_size=32)
    ds = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 64,
          "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}
    deepspeed_save(tmp_path, {"ds_config": ds, "dp_world_size": 8, "mp_world_size": 4, "args": args})
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = estimate(capsys, "--from", str(tmp_path))
    assert code == 0, got
    plan = got["plan"]
    assert plan["engine"] == "megatron-deepspeed" and (plan["tp"], plan["dp"], plan["zero_stage"]) == (4, 8, 1)


def test_namespace_argv_writes_what_the_parser_would_read_back():
    args = argparse.Namespace(add_bias_linear=False, bf16=True, fp16=False, tensor_model_parallel_size=1,
                              recompute_modules=["core_attn", "mlp"], seq_length=4096, num_experts=None,
                              moe_token_dispatcher_type="alltoall", expert_tensor_parallel_size=1,
                              moe_layer_freq=[0, 1, 1], window_size=(127, 0), rl_use_sequence_packing=False)
    argv = namespace_argv(args, [])
    assert "--disable-bias-linear" in argv and "--bf16" in argv and "--fp16" not in argv  # store_false / true
    assert "--tensor-model-parallel-size" not in argv  # 1, the parser's default: as a file that leaves it out
    i = argv.index("--recompute-modules")
    assert argv[i + 1: i + 3] == ["core_attn", "mlp"]  # nargs "+"
    assert argv[argv.index("--window-size") + 1] == "127,0"
    assert not any("rl-use-sequence-packing" in a for a in argv)  # BooleanOptionalAction at its default (off)
    packed = namespace_argv(argparse.Namespace(**vars(args) | {"rl_use_sequence_packing": True}), [])
    assert "--rl-use-sequence-packing" in packed  # on: written
    assert not any(a.startswith(("--moe-", "--expert-")) for a in argv)  # a dense model's MoE defaults: left out
    moe = namespace_argv(argparse.Namespace(**vars(args) | {"num_experts": 8}), [])
    assert moe[moe.index("--moe-layer-freq") + 1] == "[0, 1, 1]" and "--moe-token-dispatcher-type" in moe


def test_read_checkpoint_says_what_it_read(tmp_path, monkeypatch):
    backend = megatron_enums(monkeypatch)
    save_megatron(tmp_path, {"args": megatron_args(backend)}, "torch")
    monkeypatch.delitem(sys.modules, ENUMS)
    job = read_checkpoint(tmp_path)
    assert job.source == str(tmp_path / "iter_0000100") and job.world_size == 64 and job.ds_config is None
    assert job.notes == [f"{tmp_path}: the arguments saved with iter_0000100"]  # the tracker's save
    assert job.argv[job.argv.index("--tensor-model-parallel-size") + 1] == "8"
    assert "--attention-backend" not in job.argv  # AttnBackend.auto: the parser's default, left out


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_trainer_fsdp_checkpoint_states_its_plan(tmp_path, capsys):
    folder = tmp_path / "checkpoint-10"
    trainer_args(folder, per_device_train_batch_size=2, gradient_accumulation_steps=4, bf16=True,
                   fsdp="full_shard", fsdp_config={"cpu_offload": True, "activation_checkpointing": True})
    code, got = estimate(capsys, "--from", str(folder), "--seq-len", "4096")
    assert code == 0, got
    plan = got["plan"]
    assert (plan["engine"], plan["zero_stage"], plan["recompute"]) == ("fsdp", 3, "full")
    assert plan["offload_param"] == plan["offload_optimizer"] == "cpu"  # FSDP2's CPUOffloadPolicy
    assert (plan["micro_batch_size"], plan["global_batch_size"], plan["dp"]) == (2, 8, 1)  # the run's one process
    assert got["model"]["spec"]["hidden_size"] == 3072


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_trainer_deepspeed_checkpoint_is_the_hf_engine_with_its_checkpointing(tmp_path, capsys):
    folder = tmp_path / "checkpoint-20"
    deepspeed_save(folder, {"ds_config": DS_CONFIG | {"zero_optimization": {"stage": 2}}, "dp_world_size": 4,
                             "mp_world_size": 1})
    trainer_args(folder, per_device_train_batch_size=2, gradient_accumulation_steps=8, bf16=True,
                   gradient_checkpointing=True, deepspeed={"zero_optimization": {"stage": 2}})
    code, got = estimate(capsys, "--from", str(folder), "--seq-len", "4096")
    assert code == 0, got
    plan = got["plan"]
    assert (plan["engine"], plan["zero_stage"], plan["recompute"], plan["dp"]) == ("hf", 2, "full", 4)


def test_the_tag_folder_of_a_trainer_checkpoint_finds_the_model_beside_it(tmp_path, capsys):
    folder = tmp_path / "checkpoint-20"
    deepspeed_save(folder, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    (folder / "config.json").write_text(json.dumps(PHI3_CONFIG))
    code, got = estimate(capsys, "--from", str(folder / "global_step20"), "--seq-len", "4096")
    assert code == 0, got
    assert got["model"]["spec"]["hidden_size"] == 3072 and got["plan"]["dp"] == 4


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_torch_dcp_save_reads_its_args_entry_and_a_torchtitan_one_is_named(tmp_path, capsys, monkeypatch):
    # Megatron's torch_dcp / fsdp_dtensor formats save the state's keys as entries, 'args' among them
    # (checkpointing.py:1744-1764 at core_v0.19.0); a torchtitan checkpoint has no such entry
    import torch.distributed.checkpoint as dcp

    backend = megatron_enums(monkeypatch)
    save = tmp_path / "save" / "iter_0000100"
    dcp.save({"args": megatron_args(backend), "iteration": 100, "model": {"w": torch.zeros(4)}},
             storage_writer=dcp.FileSystemWriter(str(save)), no_dist=True)
    (tmp_path / "save" / "latest_checkpointed_iteration.txt").write_text("100")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 0, got
    assert (got["plan"]["tp"], got["plan"]["pp"], got["plan"]["dp"]) == (8, 4, 2)
    titan = tmp_path / "step-10"
    dcp.save({"model": {"w": torch.zeros(4)}, "train_state": {"step": 10}},
             storage_writer=dcp.FileSystemWriter(str(titan)), no_dist=True)
    code, err = estimate(capsys, "--from", str(titan), "--model", "llama3-8b", "--num-gpus", "8")
    assert code == 2 and "without Megatron-LM's arguments ('args'): a torchtitan or other checkpoint?" in err, err


def test_a_megatron_bridge_save_folder_reads_its_run_config(tmp_path, capsys):
    # Bridge keeps Megatron-LM's tracker and iter_ folders and writes run_config.yaml into each save
    # (training/checkpointing.py:1434 of Bridge 0.6); its torch_dist files hold no Megatron-LM 'args'
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "bridge" / "run_config.yaml"  # Bridge's own dump (SOURCES.md)
    save = tmp_path / "iter_0000200"
    save.mkdir()
    shutil.copy(fixture, save / "run_config.yaml")
    (save / ".metadata").write_bytes(b"")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("200")
    code, from_folder = estimate(capsys, "--from", str(tmp_path), "--num-gpus", "16")
    assert code == 0, from_folder
    code, from_file = estimate(capsys, "--from", str(fixture), "--num-gpus", "16")
    assert code == 0 and from_folder["plan"] == from_file["plan"] and from_folder["model"] == from_file["model"]
    assert from_folder["plan"]["ep"] == 16


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_checkpoint_file_given_alone_reads_as_its_folder(tmp_path, capsys, monkeypatch):
    backend = megatron_enums(monkeypatch)
    save_megatron(tmp_path / "meg", {"args": megatron_args(backend)}, "torch")
    monkeypatch.delitem(sys.modules, ENUMS)
    rank0 = tmp_path / "meg" / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt"
    code, got = estimate(capsys, "--from", str(rank0))
    assert code == 0 and (got["plan"]["tp"], got["plan"]["dp"]) == (8, 2), got
    deepspeed_save(tmp_path / "ds", {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1}, zero3=True)
    states = tmp_path / "ds" / "global_step20" / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    code, got = estimate(capsys, "--from", str(states), "--model", "phi3-mini")
    assert code == 0 and (got["plan"]["zero_stage"], got["plan"]["dp"]) == (3, 4), got
    trainer_args(tmp_path / "hf", per_device_train_batch_size=2, gradient_accumulation_steps=4, bf16=True)
    code, got = estimate(capsys, "--from", str(tmp_path / "hf" / "training_args.bin"), "--seq-len", "4096")
    assert code == 0 and got["plan"]["global_batch_size"] == 8, got


def test_a_universal_deepspeed_checkpoint_reads_through_its_tracker(tmp_path, capsys):
    # ds_to_universal.py copies the model-states files into the folder latest_universal names (0.19.8 :1355-1372)
    deepspeed_save(tmp_path, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    (tmp_path / "global_step20").rename(tmp_path / "global_step20_universal")
    (tmp_path / "latest").unlink()
    (tmp_path / "latest_universal").write_text("global_step20_universal")
    code, got = estimate(capsys, "--from", str(tmp_path), "--model", "phi3-mini")
    assert code == 0 and (got["plan"]["zero_stage"], got["plan"]["dp"]) == (3, 4), got


def test_locate_finds_each_engines_save_once_and_says_where(tmp_path, monkeypatch):
    backend = megatron_enums(monkeypatch)
    save_megatron(tmp_path / "meg", {"args": megatron_args(backend)}, "common.pt")
    got = locate(tmp_path / "meg")
    assert got.megatron_save == tmp_path / "meg" / "iter_0000100" and got.run_config is None
    assert read_checkpoint(got).argv == read_checkpoint(tmp_path / "meg").argv  # a layout reads as its folder
    (tmp_path / "meg" / "iter_0000100" / "run_config.yaml").write_text("model: {}\n")  # Bridge writes one per save
    assert locate(tmp_path / "meg").run_config == tmp_path / "meg" / "iter_0000100" / "run_config.yaml"
    deepspeed_save(tmp_path / "ds", {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    got = locate(tmp_path / "ds")
    assert got.deepspeed_states == tmp_path / "ds" / "global_step20" / "mp_rank_00_model_states.pt"
    assert (got.megatron_save, got.trainer_args) == (None, None)
    trainer_args(tmp_path / "hf", per_device_train_batch_size=2)
    assert locate(tmp_path / "hf").trainer_args == tmp_path / "hf" / "training_args.bin"
    (tmp_path / "bridge").mkdir()  # a save folder holding Bridge's run_config.yaml alone reads as that file
    (tmp_path / "bridge" / "run_config.yaml").write_text("model: {}\n")
    assert locate(tmp_path / "bridge").run_config == tmp_path / "bridge" / "run_config.yaml"
    (tmp_path / "empty").mkdir()
    assert locate(tmp_path / "empty") is None and locate(tmp_path / "ds" / "latest") is None  # a file is no folder
    why, layout = inspect_path(str(tmp_path / "empty"))
    assert layout is None and "a folder without a Megatron-LM, DeepSpeed or Trainer checkpoint" in why
    assert inspect_path(str(tmp_path / "ds" / "latest")) == (None, None)
    (tmp_path / "ds" / "latest").write_text("global_step99")
    with pytest.raises(InputError, match="names 'global_step99', which is no folder"):
        locate(tmp_path / "ds")
