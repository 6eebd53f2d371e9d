"""`--from CHECKPOINT_FOLDER` (autotune.job_checkpoint): the job a Megatron-LM or DeepSpeed checkpoint states, in the
layouts and formats the engines write (their own savers run in tests/test_job_checkpoint_real.py); a checkpoint
cannot run code while it is read; bad folders and files exit 2 naming the problem."""
from __future__ import annotations

import argparse
import enum
import json
import os
import pickle
import shutil
import sys
import types

import pytest
import torch

from autotune.cli import main
from autotune.job_checkpoint import namespace_argv, read_checkpoint

ENUMS = "megatron.core.transformer.enums"


def _megatron_enums(monkeypatch):
    """Megatron-core's AttnBackend (values of core_v0.19.0), pickled under its own module name though megatron is
    not installed here: the module exists while the test saves and is gone when autotune reads."""
    module = types.ModuleType(ENUMS)

    class AttnBackend(enum.Enum):
        flash, fused, unfused, local, auto = 1, 2, 3, 4, 5

    AttnBackend.__module__, AttnBackend.__qualname__ = ENUMS, "AttnBackend"
    module.AttnBackend = AttnBackend
    for name in ("megatron", "megatron.core", "megatron.core.transformer"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, ENUMS, module)
    return AttnBackend


def _args(backend, **over) -> argparse.Namespace:
    """Llama-3-70B on 64 GPUs as Megatron's validated arguments hold it (dests of megatron/training/arguments.py)."""
    values = dict(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, kv_channels=128,
                  group_query_attention=True, num_query_groups=8, seq_length=8192, max_position_embeddings=8192,
                  swiglu=True, normalization="RMSNorm", position_embedding_type="rope", rotary_base=500000,
                  untie_embeddings_and_output_weights=True, add_bias_linear=False, micro_batch_size=1,
                  global_batch_size=512, tensor_model_parallel_size=8, pipeline_model_parallel_size=4,
                  num_layers_per_virtual_pipeline_stage=5, virtual_pipeline_model_parallel_size=4,
                  sequence_parallel=True, bf16=True, fp16=False, use_distributed_optimizer=True,
                  overlap_grad_reduce=True, recompute_granularity="selective", world_size=64, rank=0,
                  params_dtype=torch.bfloat16, attention_backend=backend.auto, num_experts=None,
                  expert_tensor_parallel_size=8, moe_token_dispatcher_type="allgather", padded_vocab_size=128256,
                  vocab_size=128256, cp_comm_type=["p2p"], context_parallel_size=1)
    return argparse.Namespace(**(values | over))


def _save_megatron(folder, state, layout: str) -> None:
    """A save as megatron/training/checkpointing.py (core_v0.19.0) lays it out: the tracker, then iter_0000100/ with
    the legacy torch_dist common.pt or the torch format's mp_rank_00/model_optim_rng.pt."""
    save = folder / "iter_0000100"
    if layout == "torch":
        (save / "mp_rank_00").mkdir(parents=True)
        torch.save(state | {"model": {"w": torch.zeros(16)}}, save / "mp_rank_00" / "model_optim_rng.pt")
    else:
        save.mkdir(parents=True)
        torch.save(state, save / "common.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text("100\n")


def _estimate(capsys, *argv) -> tuple[int, dict | str]:
    code = main(["estimate", "--gpu", "h100-sxm-80gb", "--json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


@pytest.mark.parametrize("layout", ["torch", "common.pt"])
def test_a_megatron_checkpoint_states_its_plan_world_size_and_model(tmp_path, capsys, monkeypatch, layout):
    backend = _megatron_enums(monkeypatch)
    _save_megatron(tmp_path, {"args": _args(backend), "iteration": 100, "checkpoint_version": 3.0}, layout)
    monkeypatch.delitem(sys.modules, ENUMS)  # autotune reads without Megatron
    code, got = _estimate(capsys, "--from", str(tmp_path))
    assert code == 0, got
    plan = got["plan"]
    assert (plan["tp"], plan["pp"], plan["vpp"], plan["dp"]) == (8, 4, 4, 2)  # dp from args.world_size 64
    assert (plan["micro_batch_size"], plan["global_batch_size"], plan["seq_len"]) == (1, 512, 8192)
    assert plan["zero_stage"] == 1 and plan["sequence_parallel"] and plan["recompute"] == "selective"
    assert plan["precision"] == "bf16" and plan["ep"] == 1 and plan["flash_attention"]  # a dense model: no MoE
    assert got["model"]["name"] == "llama3-70b"


def test_megatron_enums_in_the_arguments_are_read_by_value(tmp_path, capsys, monkeypatch):
    backend = _megatron_enums(monkeypatch)
    _save_megatron(tmp_path, {"args": _args(backend, attention_backend=backend.unfused)}, "common.pt")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = _estimate(capsys, "--from", str(tmp_path / "iter_0000100"))  # one save's folder, no tracker
    assert code == 0, got
    assert got["plan"]["flash_attention"] is False  # --attention-backend unfused


class _Payload:
    """An object whose unpickling calls ``call(*args)``, as a hostile checkpoint would hold one."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def test_reading_a_checkpoint_runs_no_code_from_it(tmp_path, capsys, monkeypatch):
    backend = _megatron_enums(monkeypatch)
    source, copied = tmp_path / "a", tmp_path / "b"
    source.write_text("x")
    hook = _Payload(shutil.copyfile, str(source), str(copied))  # a callable torch's loader does not block by name
    _save_megatron(tmp_path / "save", {"args": _args(backend), "hook": hook}, "common.pt")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = _estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 0, got
    assert not copied.exists()  # torch.load(weights_only=False) would have copied the file
    assert got["plan"]["tp"] == 8


def test_a_checkpoint_naming_a_blocked_module_is_refused_unloaded(tmp_path, capsys, monkeypatch):
    backend = _megatron_enums(monkeypatch)
    marker = tmp_path / "ran"
    _save_megatron(tmp_path / "save", {"args": _args(backend), "hook": _Payload(os.system, f"touch {marker}")},
                   "common.pt")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, err = _estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 2 and "names posix.system" in err and "was not loaded" in err, err
    assert not marker.exists()


def _deepspeed_save(folder, state, *, zero3: bool = False) -> None:
    """DeepSpeed's layout (runtime/engine.py 0.19.8): ``latest`` names the tag, whose folder holds rank 0's model
    states (``zero_pp_rank_0_mp_rank_00_model_states.pt`` under ZeRO-3)."""
    tag = folder / "global_step20"
    tag.mkdir(parents=True)
    name = "zero_pp_rank_0_mp_rank_00_model_states.pt" if zero3 else "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.zeros(4)}, "global_steps": 20, "ds_version": "0.19.8"} | state, tag / name)
    (folder / "latest").write_text("global_step20")


DS_CONFIG = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
             "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
PHI3_CONFIG = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
               "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 32, "max_position_embeddings": 4096, "hidden_act": "silu",
               "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False}


def test_a_trainer_deepspeed_checkpoint_states_its_config_world_size_and_model(tmp_path, capsys):
    folder = tmp_path / "checkpoint-20"
    _deepspeed_save(folder, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1}, zero3=True)
    (folder / "config.json").write_text(json.dumps(PHI3_CONFIG))
    code, got = _estimate(capsys, "--from", str(folder), "--seq-len", "4096")
    assert code == 0, got
    plan = got["plan"]
    assert (plan["zero_stage"], plan["micro_batch_size"], plan["dp"], plan["global_batch_size"]) == (3, 2, 4, 64)
    assert got["model"]["spec"]["num_layers"] == 32 and got["model"]["spec"]["hidden_size"] == 3072
    assert plan["engine"] == "deepspeed"


@pytest.mark.parametrize("release, said", [("0.19.8", False), ("0.14.4", True)])
def test_a_deepspeed_checkpoint_of_another_release_says_so(tmp_path, capsys, release, said):
    _deepspeed_save(tmp_path, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1, "ds_version": release})
    code = main(["estimate", "--from", str(tmp_path), "--model", "phi3-mini", "--gpu", "h100-sxm-80gb"])
    assert code == 0
    err = capsys.readouterr().err
    assert ("saved by DeepSpeed 0.14.4; estimated as DeepSpeed 0.19.8" in err) is said, err


def test_a_ds_config_given_as_a_path_is_read_where_it_is(tmp_path, capsys):
    (tmp_path / "ds_config.json").write_text(json.dumps(DS_CONFIG))
    _deepspeed_save(tmp_path / "save", {"ds_config": str(tmp_path / "ds_config.json"), "dp_world_size": 4,
                                        "mp_world_size": 1})
    code, got = _estimate(capsys, "--from", str(tmp_path / "save"), "--model", "phi3-mini", "--seq-len", "4096")
    assert code == 0, got
    assert got["plan"]["zero_stage"] == 3 and got["plan"]["dp"] == 4
    (tmp_path / "ds_config.json").unlink()
    code, err = _estimate(capsys, "--from", str(tmp_path / "save"), "--model", "phi3-mini")
    assert code == 2 and "its DeepSpeed config was the file" in err and "give that ds_config.json to --from" in err


def test_a_megatron_deepspeed_checkpoint_reads_its_arguments_beside_deepspeeds_config(tmp_path, capsys, monkeypatch):
    backend = _megatron_enums(monkeypatch)
    args = _args(backend, deepspeed=True, zero_stage=1, tensor_model_parallel_size=4, pipeline_model_parallel_size=1,
                 num_layers_per_virtual_pipeline_stage=None, virtual_pipeline_model_parallel_size=None,
                 use_distributed_optimizer=False, world_size=32)
    ds = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 64,
          "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}
    _deepspeed_save(tmp_path, {"ds_config": ds, "dp_world_size": 8, "mp_world_size": 4, "args": args})
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = _estimate(capsys, "--from", str(tmp_path))
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
    assert "--no-rl-use-sequence-packing" in argv  # BooleanOptionalAction, off
    assert not any(a.startswith(("--moe-", "--expert-")) for a in argv)  # a dense model's MoE defaults: left out
    moe = namespace_argv(argparse.Namespace(**vars(args) | {"num_experts": 8}), [])
    assert moe[moe.index("--moe-layer-freq") + 1] == "[0, 1, 1]" and "--moe-token-dispatcher-type" in moe


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
    _save_megatron(tmp_path / "ck", {"iteration": 100}, "common.pt")


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
    code, err = _estimate(capsys, "--from", str(tmp_path / "ck"), "--model", "llama3-8b", "--num-gpus", "8")
    assert code == 2 and words in err and "Traceback" not in err, err


def test_read_checkpoint_says_what_it_read(tmp_path, monkeypatch):
    backend = _megatron_enums(monkeypatch)
    _save_megatron(tmp_path, {"args": _args(backend)}, "torch")
    monkeypatch.delitem(sys.modules, ENUMS)
    job = read_checkpoint(tmp_path)
    assert job.source == str(tmp_path / "iter_0000100") and job.world_size == 64 and job.ds_config is None
    assert job.notes == [f"{tmp_path}: the arguments saved with iter_0000100"]  # the tracker's save
    assert job.argv[job.argv.index("--tensor-model-parallel-size") + 1] == "8"
    assert "--attention-backend" not in job.argv  # AttnBackend.auto: the parser's default, left out


def test_validate_on_a_checkpoint_folder_points_to_from(tmp_path, capsys):
    _deepspeed_save(tmp_path, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder: validate checks files" in err and "autotune estimate --from FOLDER" in err


def _training_args(folder, **kw):
    """TrainingArguments saved as the Trainer saves them with a checkpoint (transformers trainer.py:4229)."""
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(folder / "out"), use_cpu=True, report_to=[], **kw)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(args, folder / "training_args.bin")
    (folder / "config.json").write_text(json.dumps(PHI3_CONFIG))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_trainer_fsdp_checkpoint_states_its_plan(tmp_path, capsys):
    folder = tmp_path / "checkpoint-10"
    _training_args(folder, per_device_train_batch_size=2, gradient_accumulation_steps=4, bf16=True,
                   fsdp="full_shard", fsdp_config={"cpu_offload": True, "activation_checkpointing": True})
    code, got = _estimate(capsys, "--from", str(folder), "--seq-len", "4096")
    assert code == 0, got
    plan = got["plan"]
    assert (plan["engine"], plan["zero_stage"], plan["recompute"]) == ("fsdp", 3, "full")
    assert plan["offload_param"] == plan["offload_optimizer"] == "cpu"  # FSDP2's CPUOffloadPolicy
    assert (plan["micro_batch_size"], plan["global_batch_size"], plan["dp"]) == (2, 8, 1)  # the run's one process
    assert got["model"]["spec"]["hidden_size"] == 3072


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_trainer_deepspeed_checkpoint_is_the_hf_engine_with_its_checkpointing(tmp_path, capsys):
    folder = tmp_path / "checkpoint-20"
    _deepspeed_save(folder, {"ds_config": DS_CONFIG | {"zero_optimization": {"stage": 2}}, "dp_world_size": 4,
                             "mp_world_size": 1})
    _training_args(folder, per_device_train_batch_size=2, gradient_accumulation_steps=8, bf16=True,
                   gradient_checkpointing=True, deepspeed={"zero_optimization": {"stage": 2}})
    code, got = _estimate(capsys, "--from", str(folder), "--seq-len", "4096")
    assert code == 0, got
    plan = got["plan"]
    assert (plan["engine"], plan["zero_stage"], plan["recompute"], plan["dp"]) == ("hf", 2, "full", 4)


def _save_torch_dist(folder, state) -> None:
    """A torch_dist save as megatron-core 0.19 writes it (its own saver: tests/test_job_checkpoint_real.py): the common
    state one pickled entry of the torch.distributed.checkpoint files (serialization.py:206-237), metadata.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    save = folder / "iter_0000100"
    save.mkdir(parents=True)
    dcp.save({"common_state/shard_0_1": [state]}, storage_writer=dcp.FileSystemWriter(str(save)),
             planner=DefaultSavePlanner(flatten_state_dict=False), no_dist=True)  # one entry, as a ShardedObject
    (save / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    (folder / "latest_checkpointed_iteration.txt").write_text("100")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_torch_dist_save_reads_and_its_index_runs_no_code(tmp_path, capsys, monkeypatch):
    backend = _megatron_enums(monkeypatch)
    _save_torch_dist(tmp_path / "save", {"args": _args(backend), "iteration": 100})
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = _estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 0, got
    assert (got["plan"]["tp"], got["plan"]["pp"], got["plan"]["dp"]) == (8, 4, 2)
    marker = tmp_path / "ran"
    # torch's own FileSystemReader takes the .metadata index with pickle.load: a hostile index would run
    (tmp_path / "save" / "iter_0000100" / ".metadata").write_bytes(
        pickle.dumps(_Payload(os.system, f"touch {marker}")))
    code, err = _estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 2 and ".metadata: names posix.system" in err and "was not loaded" in err, err
    assert not marker.exists()


def test_the_tag_folder_of_a_trainer_checkpoint_finds_the_model_beside_it(tmp_path, capsys):
    folder = tmp_path / "checkpoint-20"
    _deepspeed_save(folder, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    (folder / "config.json").write_text(json.dumps(PHI3_CONFIG))
    code, got = _estimate(capsys, "--from", str(folder / "global_step20"), "--seq-len", "4096")
    assert code == 0, got
    assert got["model"]["spec"]["hidden_size"] == 3072 and got["plan"]["dp"] == 4


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_torch_dcp_save_reads_its_args_entry_and_a_torchtitan_one_is_named(tmp_path, capsys, monkeypatch):
    # Megatron's torch_dcp / fsdp_dtensor formats save the state's keys as entries, 'args' among them
    # (checkpointing.py:1744-1764 at core_v0.19.0); a torchtitan checkpoint has no such entry
    import torch.distributed.checkpoint as dcp

    backend = _megatron_enums(monkeypatch)
    save = tmp_path / "save" / "iter_0000100"
    dcp.save({"args": _args(backend), "iteration": 100, "model": {"w": torch.zeros(4)}},
             storage_writer=dcp.FileSystemWriter(str(save)), no_dist=True)
    (tmp_path / "save" / "latest_checkpointed_iteration.txt").write_text("100")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, got = _estimate(capsys, "--from", str(tmp_path / "save"))
    assert code == 0, got
    assert (got["plan"]["tp"], got["plan"]["pp"], got["plan"]["dp"]) == (8, 4, 2)
    titan = tmp_path / "step-10"
    dcp.save({"model": {"w": torch.zeros(4)}, "train_state": {"step": 10}},
             storage_writer=dcp.FileSystemWriter(str(titan)), no_dist=True)
    code, err = _estimate(capsys, "--from", str(titan), "--model", "llama3-8b", "--num-gpus", "8")
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
    code, from_folder = _estimate(capsys, "--from", str(tmp_path), "--num-gpus", "16")
    assert code == 0, from_folder
    code, from_file = _estimate(capsys, "--from", str(fixture), "--num-gpus", "16")
    assert code == 0 and from_folder["plan"] == from_file["plan"] and from_folder["model"] == from_file["model"]
    assert from_folder["plan"]["ep"] == 16


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_checkpoint_file_given_alone_reads_as_its_folder(tmp_path, capsys, monkeypatch):
    backend = _megatron_enums(monkeypatch)
    _save_megatron(tmp_path / "meg", {"args": _args(backend)}, "torch")
    monkeypatch.delitem(sys.modules, ENUMS)
    rank0 = tmp_path / "meg" / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt"
    code, got = _estimate(capsys, "--from", str(rank0))
    assert code == 0 and (got["plan"]["tp"], got["plan"]["dp"]) == (8, 2), got
    _deepspeed_save(tmp_path / "ds", {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1}, zero3=True)
    states = tmp_path / "ds" / "global_step20" / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    code, got = _estimate(capsys, "--from", str(states), "--model", "phi3-mini")
    assert code == 0 and (got["plan"]["zero_stage"], got["plan"]["dp"]) == (3, 4), got
    _training_args(tmp_path / "hf", per_device_train_batch_size=2, gradient_accumulation_steps=4, bf16=True)
    code, got = _estimate(capsys, "--from", str(tmp_path / "hf" / "training_args.bin"), "--seq-len", "4096")
    assert code == 0 and got["plan"]["global_batch_size"] == 8, got


def test_a_universal_deepspeed_checkpoint_reads_through_its_tracker(tmp_path, capsys):
    # ds_to_universal.py copies the model-states files into the folder latest_universal names (0.19.8 :1355-1372)
    _deepspeed_save(tmp_path, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    (tmp_path / "global_step20").rename(tmp_path / "global_step20_universal")
    (tmp_path / "latest").unlink()
    (tmp_path / "latest_universal").write_text("global_step20_universal")
    code, got = _estimate(capsys, "--from", str(tmp_path), "--model", "phi3-mini")
    assert code == 0 and (got["plan"]["zero_stage"], got["plan"]["dp"]) == (3, 4), got
