"""`autotune validate CHECKPOINT_FOLDER` (autotune.commands.validate_checkpoint): the config a DeepSpeed save holds
is linted as a DeepSpeed JSON for the world size it saved, a Megatron-Bridge save's run_config.yaml as that file, a
Megatron-LM save's arguments as the argument list that parses to them (and megatron-core's rules); a Trainer
checkpoint (no config file in it) exits 2 pointing to `estimate --from`. The real DeepSpeed and megatron-core savers'
folders validate clean in tests/test_job_checkpoint_real.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from checkpoint_helpers import (ENUMS, DS_CONFIG, deepspeed_save, megatron_args, megatron_enums, save_megatron,
                                trainer_args)

from autotune.cli import main

RUN_CONFIG = Path(__file__).parent / "fixtures" / "bridge" / "run_config.yaml"  # Bridge's own dump (SOURCES.md)


def validate(capsys, *argv) -> tuple[int, str, str]:
    code = main(["validate", *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_a_deepspeed_save_validates_its_config_for_the_world_it_saved(tmp_path, capsys):
    deepspeed_save(tmp_path, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    code, out, err = validate(capsys, tmp_path)
    assert code == 0 and "no problems for world size 4" in out, out + err
    assert "the DeepSpeed config saved in" in err and "mp_rank_00_model_states.pt" in err


def test_a_deepspeed_saves_bad_config_is_reported_by_json_path(tmp_path, capsys):
    bad = DS_CONFIG | {"train_batch_size": 60, "zero_optimization": {"stage": 3, "bogus": 1}}
    deepspeed_save(tmp_path, {"ds_config": bad, "dp_world_size": 4, "mp_world_size": 1})
    code, out, _ = validate(capsys, tmp_path)
    assert code == 1
    assert "$.zero_optimization.bogus: unknown key 'bogus'" in out
    assert "$.train_batch_size: train_batch_size 60 != micro-batch 2 x gradient accumulation 8 x data-parallel " \
           "size 4 = 64" in out and "2 error(s)" in out
    code, out, _ = validate(capsys, tmp_path, "--json")
    problems = json.loads(out)
    assert code == 1 and {p["file"] for p in problems} == {str(tmp_path)} and len(problems) == 2
    code, out, _ = validate(capsys, tmp_path, "--world-size", "2")  # the flag wins over the saved size
    assert "data-parallel size 2 = 32" in out


def test_a_deepspeed_save_with_the_memory_check(tmp_path, capsys):
    deepspeed_save(tmp_path, {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    code, out, err = validate(capsys, tmp_path, "--model", "phi3-mini", "--gpu", "h100-sxm-80gb", "--seq-len", "4096")
    assert code == 0 and "no problems for world size 4" in out, out + err
    code, out, err = validate(capsys, tmp_path, "--model", "llama3-70b", "--gpu", "h100-sxm-80gb")
    assert code == 1 and "memory" in out, out + err  # 70B with ZeRO-3 over 4 GPUs does not fit: said, not refused


def test_a_bridge_save_validates_its_run_config(tmp_path, capsys):
    save = tmp_path / "iter_0000200"
    save.mkdir()
    shutil.copy(RUN_CONFIG, save / "run_config.yaml")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("200")
    folder = validate(capsys, tmp_path, "--world-size", "16")
    direct = validate(capsys, RUN_CONFIG, "--world-size", "16")
    assert folder[0] == direct[0] and folder[1].replace(str(save / "run_config.yaml"), "X") == \
        direct[1].replace(str(RUN_CONFIG), "X")
    assert "the Megatron-Bridge save's" in folder[2]


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_megatron_save_validates_its_arguments_for_the_world_it_saved(tmp_path, capsys, monkeypatch):
    backend = megatron_enums(monkeypatch)
    save_megatron(tmp_path / "meg", {"args": megatron_args(backend)}, "common.pt")
    monkeypatch.delitem(sys.modules, ENUMS)  # read where megatron is not installed
    code, out, err = validate(capsys, tmp_path / "meg")
    assert code == 0 and "no problems for world size 64" in out, out + err  # args.world_size
    assert "the arguments saved in" in err and "iter_0000100" in err
    assert "CUDA_DEVICE_MAX_CONNECTIONS not checked" in err  # the save holds no environment
    code, out, _ = validate(capsys, tmp_path / "meg", "--world-size", "48")  # resumed on 48 GPUs: tp 8 x pp 4 no
    assert code == 1 and "world size (48) is not divisible by total_model_size tp*pp*cp = 8*4*1 = 32" in out, out


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_megatron_save_is_asked_of_megatron_cores_rules(tmp_path, capsys, monkeypatch):
    """An MoE job saved with the EP all-to-all overlap on 4 pipeline stages and no interleaving (what a release
    before the rule ran): megatron-core 0.19.2's TransformerConfig refuses it, and validate says so with the line."""
    backend = megatron_enums(monkeypatch)
    args = megatron_args(backend, num_experts=8, moe_router_topk=2, expert_model_parallel_size=2,
                         moe_ffn_hidden_size=14336, moe_token_dispatcher_type="alltoall",
                         overlap_moe_expert_parallel_comm=True, num_layers_per_virtual_pipeline_stage=None,
                         virtual_pipeline_model_parallel_size=None)
    save_megatron(tmp_path / "meg", {"args": args}, "common.pt")
    monkeypatch.delitem(sys.modules, ENUMS)
    code, out, _ = validate(capsys, tmp_path / "meg", "--json")
    problems = json.loads(out)
    assert code == 1 and [p["source"] for p in problems] == ["megatron-core"], problems
    assert "virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size > 1" in \
        problems[0]["message"] and "transformer_config.py:2674-2678" in problems[0]["message"]
    assert "--vpp 2" in problems[0]["fix"]


def test_a_trainer_checkpoint_points_to_estimate_from(tmp_path, capsys, monkeypatch):
    trainer_args(tmp_path / "hf", per_device_train_batch_size=2)
    code, _, err = validate(capsys, tmp_path / "hf")
    assert code == 2 and "a Trainer checkpoint holds its TrainingArguments, no config file" in err
    assert f"autotune estimate --from {tmp_path / 'hf'} --gpu GPU" in err
    backend = megatron_enums(monkeypatch)
    save_megatron(tmp_path / "meg", {"args": megatron_args(backend)}, "common.pt")
    (tmp_path / "empty").mkdir()
    code, _, err = validate(capsys, tmp_path / "empty")
    assert code == 2 and "a folder without a Megatron-LM, DeepSpeed or Trainer checkpoint" in err
    code, _, err = validate(capsys, tmp_path / "meg", "--kind", "megatron")
    assert code == 2  # --kind names a file's kind: a folder is no such file


def test_a_save_rewritten_in_place_is_read_again(tmp_path, capsys):
    # the same folder, a new save over the old one (as a resumed job writes): validated as it is now
    deepspeed_save(tmp_path / "ck", {"ds_config": DS_CONFIG, "dp_world_size": 4, "mp_world_size": 1})
    assert validate(capsys, tmp_path / "ck")[0] == 0
    shutil.rmtree(tmp_path / "ck")
    deepspeed_save(tmp_path / "ck", {"ds_config": DS_CONFIG | {"train_batch_size": 60}, "dp_world_size": 4,
                                     "mp_world_size": 1})
    code, out, _ = validate(capsys, tmp_path / "ck")
    assert code == 1 and "train_batch_size 60" in out


def test_the_library_linter_given_a_folder_names_both_ways(tmp_path):
    from autotune.errors import InputError
    from autotune.lint import lint_file

    with pytest.raises(InputError) as err:
        lint_file(tmp_path, world_size=8)
    text = err.value.render()
    assert "is a folder, not a config file" in text and "autotune validate FOLDER" in text
    assert "autotune estimate --from FOLDER" in text


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_megatron_deepspeed_save_validates_its_arguments_with_its_config(tmp_path, capsys, monkeypatch):
    """Its ds_config and the arguments beside it (the client state's ``args``): each alone and the two together, as
    `validate megatron_args.sh ds_config.json` checks the files."""
    backend = megatron_enums(monkeypatch)
    args = megatron_args(backend, deepspeed=True, deepspeed_config="ds_config.json", zero_stage=1,
                         tensor_model_parallel_size=4, pipeline_model_parallel_size=1,
                         num_layers_per_virtual_pipeline_stage=None, virtual_pipeline_model_parallel_size=None,
                         use_distributed_optimizer=False, world_size=32, normalization="rmsnorm")  # its choices
    ds = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 64,
          "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}
    deepspeed_save(tmp_path / "ok", {"ds_config": ds, "dp_world_size": 8, "mp_world_size": 4, "args": args})
    deepspeed_save(tmp_path / "bad", {"ds_config": ds | {"train_micro_batch_size_per_gpu": 2,
                                                         "gradient_accumulation_steps": 32},
                                      "dp_world_size": 8, "mp_world_size": 4, "args": args})
    monkeypatch.delitem(sys.modules, ENUMS)
    code, out, err = validate(capsys, tmp_path / "ok")
    assert code == 0 and "no problems for world size 32" in out, out + err
    assert "the Megatron-DeepSpeed arguments saved beside it" in err
    code, out, _ = validate(capsys, tmp_path / "bad", "--json")
    problems = json.loads(out)
    assert code == 1 and [p["path"] for p in problems] == ["$.train_micro_batch_size_per_gpu"], problems
    assert "--micro-batch-size 1 in the saved arguments" in problems[0]["message"]


@pytest.mark.parametrize("torch_adam, warned", [(False, False), (True, True)])
def test_a_megatron_deepspeed_saves_cpu_optimizer_is_the_client_optimizer(torch_adam, warned, tmp_path, capsys,
                                                                         monkeypatch):
    """ZeRO-Offload with no optimizer block: the saved --cpu-optimizer passes DeepSpeedCPUAdam to
    deepspeed.initialize, so the config's warning is not given; with --cpu_torch_adam (torch's AdamW) it is."""
    backend = megatron_enums(monkeypatch)
    args = megatron_args(backend, deepspeed=True, deepspeed_config="ds_config.json", zero_stage=1,
                         tensor_model_parallel_size=4, pipeline_model_parallel_size=1,
                         num_layers_per_virtual_pipeline_stage=None, virtual_pipeline_model_parallel_size=None,
                         use_distributed_optimizer=False, world_size=32, normalization="rmsnorm",
                         cpu_optimizer=True, cpu_torch_adam=torch_adam)
    ds = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 64,
          "bf16": {"enabled": True}, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
    deepspeed_save(tmp_path / "save", {"ds_config": ds, "dp_world_size": 8, "mp_world_size": 4, "args": args})
    monkeypatch.delitem(sys.modules, ENUMS)
    code, out, err = validate(capsys, tmp_path / "save", "--json")
    problems = json.loads(out)
    assert any(p["message"].startswith("ZeRO-Offload with no optimizer block") for p in problems) == warned, problems
