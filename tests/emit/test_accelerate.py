"""accelerate 1.16 configs: each emitted YAML loads with accelerate's own loader, the DeepSpeed one passes
accelerate's DeepSpeed-plugin checks and trains under `accelerate launch` on 2 CPU ranks, the FSDP2 one is
turned by accelerate's launcher and FSDP plugin into the plan's settings; the linter finds unknown keys (nearest
key, line) and contradictions with the world size."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import pick_free_port, run_launcher  # tests/ is on sys.path (no __init__)

from autotune.api import make_plan
from autotune.emit.accelerate import (
    ACCELERATE_DS_CONFIG,
    ACCELERATE_VERSION,
    accelerate_config_yaml,
    accelerate_deepspeed_config,
    accelerate_deepspeed_yaml,
    accelerate_fsdp_yaml,
)
from autotune.emit.accelerate_lint import accelerate_config_problems, accelerate_key_table
from autotune.emit.validate_files import validate_file
from autotune.errors import InputError
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan

accelerate = pytest.importorskip("accelerate")  # a dependency (pyproject); absent only in a broken install
from accelerate.commands.config.config_args import load_config_from_file  # noqa: E402

SCRIPT = Path(__file__).parent / "fixtures" / "accelerate_tiny_train.py"
MODEL = load_model("tiny-llama")


def _plan(num_gpus=2, gpu="cpu", **kw):
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus)
    kw.setdefault("global_batch_size", 4)
    return cluster, make_plan(MODEL, cluster, seq_len=64, **kw)


def _write_ds(tmp_path, cluster, plan) -> Path:
    (tmp_path / ACCELERATE_DS_CONFIG).write_text(json.dumps(accelerate_deepspeed_config(MODEL, cluster, plan)))
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(accelerate_deepspeed_yaml(MODEL, cluster, plan))
    return path


def _launch(config: Path, cwd: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    # a rank's rare C++ abort is started once more (conftest.run_launcher)
    proc = run_launcher([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                         "--num_processes", "2", "--main_process_port", str(pick_free_port()), str(SCRIPT)], cwd=cwd,
                        env=env, timeout=300)
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "RESULT " in line]
    assert proc.returncode == 0 and results, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results[0]


def test_the_launch_config_writes_no_mixed_precision():
    cluster, plan = _plan(engine="hf", zero_stage=2)
    assert "mixed_precision" not in yaml.safe_load(accelerate_config_yaml(plan, cluster, "ds.json"))


def test_deepspeed_json_for_accelerate_is_concrete():
    cluster, plan = _plan(engine="hf", zero_stage=2)
    cfg = accelerate_deepspeed_config(MODEL, cluster, plan)
    params = cfg["optimizer"]["params"]
    assert all(isinstance(params[k], float) for k in ("lr", "eps")) and all(isinstance(b, float) for b in params["betas"])
    # 4 sequences = micro-batch 1 x accumulation 2 x dp 2.
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) \
        == (4, 1, 2)
    assert "auto" not in json.dumps(cfg)


def test_deepspeed_config_passes_accelerates_plugin_checks(tmp_path, monkeypatch):
    """accelerate's launcher exports which variables the YAML set (ACCELERATE_CONFIG_DS_FIELDS); its DeepSpeed
    plugin refuses the file when one of them duplicates the JSON. Ours passes; the pre-fix YAML (with
    mixed_precision) is refused, by accelerate and by our linter."""
    from accelerate.utils import DeepSpeedPlugin

    cluster, plan = _plan(engine="hf", zero_stage=2)
    path = _write_ds(tmp_path, cluster, plan)
    loaded = load_config_from_file(str(path))
    assert loaded.distributed_type == "DEEPSPEED" and loaded.mixed_precision is None
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(loaded.deepspeed_config))
    plugin = DeepSpeedPlugin(hf_ds_config=str(tmp_path / ACCELERATE_DS_CONFIG))
    assert plugin.deepspeed_config["optimizer"]["params"]["betas"] == [0.9, 0.95]
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join([*loaded.deepspeed_config, "mixed_precision"]))
    with pytest.raises(ValueError, match="will be ignored"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / ACCELERATE_DS_CONFIG))
    old = yaml.safe_load(path.read_text()) | {"mixed_precision": "bf16"}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    found = {(p.path, p.severity) for p in accelerate_config_problems(tmp_path / "old.yaml", world_size=2)}
    assert found == {("$.mixed_precision", "error")}


@pytest.mark.slow
def test_accelerate_launch_trains_with_the_deepspeed_config(tmp_path):
    # ZeRO-2 with the optimizer offloaded: DeepSpeedCPUAdam (the build cached in TORCH_EXTENSIONS_DIR).
    cluster, plan = _plan(engine="hf", zero_stage=2, offload_optimizer="cpu")
    result = _launch(_write_ds(tmp_path, cluster, plan), tmp_path)
    # accelerate 1.16 counts processes only on accelerators (state.py:747-758); DeepSpeed's group spans both ranks.
    assert result["distributed_type"] == "DistributedType.DEEPSPEED" and result["world_size"] == 2
    assert result["steps"] >= 1 and all(0 < loss < 100 for loss in result["losses"])


FSDP_CASES = [
    # (plan, expected accelerate FSDP plugin fields, parallelism sizes or None)
    (dict(zero_stage=3, recompute="full", offload_param="cpu", offload_optimizer="cpu"),
     dict(fsdp_version=2, reshard_after_forward=True, activation_checkpointing=True, cpu_offload="CPUOffloadPolicy"),
     None),
    (dict(zero_stage=2, dp_replicate=2, num_gpus=4), dict(fsdp_version=2, reshard_after_forward=False), None),
]


def test_fsdp2_yaml_loads_with_accelerates_loader(tmp_path):
    cluster, plan = _plan(num_gpus=8, gpu="h100-sxm-80gb", engine="fsdp", zero_stage=3, tp=2, sequence_parallel=False,
                          global_batch_size=8)
    path = tmp_path / "accelerate_fsdp.yaml"
    path.write_text(accelerate_fsdp_yaml(MODEL, cluster, plan, layer_cls="LlamaDecoderLayer"))
    loaded = load_config_from_file(str(path))
    assert loaded.distributed_type == "FSDP" and loaded.fsdp_config["fsdp_version"] == 2
    assert loaded.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert loaded.parallelism_config == {"parallelism_config_dp_replicate_size": 1,
                                         "parallelism_config_dp_shard_size": 4, "parallelism_config_tp_size": 2,
                                         "parallelism_config_cp_size": 1}
    assert validate_file(path, world_size=8, tp=2) == []


@pytest.mark.slow
def test_accelerate_launch_turns_the_fsdp2_yaml_into_the_plans_settings(tmp_path):
    """A file for 2 GPUs, launched here on CPU: accelerate 1.16 does not shard there (FSDP is engaged on
    accelerators only, so autotune writes no such file for a cpu cluster), but its launcher reads the file and its
    FSDP plugin and ParallelismConfig validate and hold every setting; the script still trains."""
    cluster, plan = _plan(gpu="h100-sxm-80gb", engine="fsdp", zero_stage=3, recompute="full", offload_param="cpu",
                          offload_optimizer="cpu")
    path = tmp_path / "accelerate_fsdp.yaml"
    path.write_text(accelerate_fsdp_yaml(MODEL, cluster, plan))
    fsdp = _launch(path, tmp_path)["fsdp"]
    assert (fsdp["fsdp_version"], fsdp["reshard_after_forward"], fsdp["activation_checkpointing"]) == (2, True, True)
    assert fsdp["transformer_cls_names_to_wrap"] == ["Block"] and fsdp["auto_wrap_policy"] == \
        "transformer_auto_wrap_policy"
    assert fsdp["cpu_offload"].startswith("CPUOffloadPolicy") and fsdp["mixed_precision"] == "bf16"
    assert fsdp["state_dict_type"] == "StateDictType.SHARDED_STATE_DICT"


def test_fsdp2_refuses_what_accelerate_cannot_run():
    cluster, plan = _plan(num_gpus=4, gpu="h100-sxm-80gb", engine="fsdp", zero_stage=3, tp=2, dp_replicate=2,
                          global_batch_size=4)
    with pytest.raises(InputError, match="no dimension for FSDP to shard"):
        accelerate_fsdp_yaml(MODEL, cluster, plan)
    # The engine refuses it too (make_plan); built directly, the emitter still says why.
    plan = ParallelPlan(dp=2, global_batch_size=4, micro_batch_size=1, grad_accum_steps=2, seq_len=64, zero_stage=3,
                        offload_optimizer="cpu", engine="fsdp")
    with pytest.raises(InputError, match="fsdp_offload_params"):
        accelerate_fsdp_yaml(MODEL, load_cluster(gpu="cpu", num_gpus=2), plan)


def test_fsdp2_refuses_cp_but_not_tp_over_pure_replication_as_accelerate_does():
    """accelerate 1.16 lifted its ParallelismConfig refusal of TP over pure replication (it keeps CP's): TP with
    dp_shard 1 is refused only because FSDP2 has nothing to shard over; CP with dp_shard 1 for the CP reason."""
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=4)
    tp_plan = ParallelPlan(dp=2, dp_replicate=2, tp=2, global_batch_size=4, micro_batch_size=1, grad_accum_steps=2,
                           seq_len=64, zero_stage=3, engine="fsdp")
    with pytest.raises(InputError, match="no dimension for FSDP to shard") as err:
        accelerate_fsdp_yaml(MODEL, cluster, tp_plan)
    assert "pure replication" not in str(err.value)
    cp_plan = ParallelPlan(dp=2, dp_replicate=2, cp=2, global_batch_size=4, micro_batch_size=1, grad_accum_steps=2,
                           seq_len=64, zero_stage=3, engine="fsdp")
    with pytest.raises(InputError, match="refuses CP with pure replication"):
        accelerate_fsdp_yaml(MODEL, cluster, cp_plan)


@pytest.mark.parametrize("sizes", [(2, 1, 2, 1), (2, 1, 1, 2), (2, 1, 2, 2), (2, 2, 2, 1), (1, 2, 1, 2)],
                         ids=lambda s: "rep{}-shard{}-tp{}-cp{}".format(*s))
def test_linter_says_pure_replication_exactly_where_accelerates_parallelism_config_raises(tmp_path, sizes):
    from accelerate.parallelism_config import ParallelismConfig

    replicate, shard, tp, cp = sizes
    try:
        ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp, cp_size=cp)
        raises = False
    except ValueError as err:
        raises = "pure data parallelism" in str(err)
    cluster, plan = _plan(num_gpus=8, gpu="h100-sxm-80gb", engine="fsdp", zero_stage=3, tp=2, sequence_parallel=False,
                          global_batch_size=8)
    data = yaml.safe_load(accelerate_fsdp_yaml(MODEL, cluster, plan))
    data["parallelism_config"] = {f"parallelism_config_{k}_size": v for k, v in
                                  zip(("dp_replicate", "dp_shard", "tp", "cp"), sizes)}
    data["num_processes"] = world = replicate * shard * tp * cp
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(data))
    found = accelerate_config_problems(path, world_size=world, tp=tp, cp=cp)
    assert any("pure replication" in p.message for p in found) == raises
    assert any("no dimension to shard" in p.message for p in found) == (shard == 1 and cp == 1)


def test_linter_knows_accelerate_1_16_dropped_ms_amp(tmp_path):
    """1.16 removed the MS-AMP FP8 backend (the backend is AO or TE: FP8BackendType), --fp8_opt_level is gone."""
    cluster, plan = _plan(gpu="h100-sxm-80gb", engine="fsdp", zero_stage=3)
    data = yaml.safe_load(accelerate_fsdp_yaml(MODEL, cluster, plan))
    data["fp8_config"] = {"fp8_backend": "msamp", "fp8_opt_level": "O2"}
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(data))
    found = {(p.path, p.severity) for p in accelerate_config_problems(path, world_size=2)}
    assert found == {("$.fp8_config.fp8_backend", "error"), ("$.fp8_config.fp8_opt_level", "warning")}


def test_files_are_written_for_the_pinned_and_installed_accelerate():
    pin = re.search(r'"accelerate==([^"]+)"', (Path(__file__).parents[2] / "pyproject.toml").read_text()).group(1)
    assert ACCELERATE_VERSION == pin == accelerate.__version__
    assert accelerate_key_table()["version"] == ACCELERATE_VERSION


def test_no_fsdp2_yaml_for_a_cpu_cluster_and_the_linter_refuses_use_cpu_with_fsdp(tmp_path):
    """Measured with accelerate 1.16.0 on this machine: an FSDP YAML launched with 2 processes on CPU (use_cpu
    true or false) gives each process DistributedType.NO and num_processes 1: the same batches, nothing sharded."""
    cluster, plan = _plan(engine="fsdp", zero_stage=3)
    with pytest.raises(InputError, match="FSDP on GPUs") as err:
        accelerate_fsdp_yaml(MODEL, cluster, plan)
    assert "launch_torchrun.sh" in str(err.value)
    gpus, plan = _plan(gpu="h100-sxm-80gb", engine="fsdp", zero_stage=3)
    path = tmp_path / "accelerate_fsdp.yaml"
    path.write_text(accelerate_fsdp_yaml(MODEL, gpus, plan))
    assert accelerate_config_problems(path, world_size=2) == []
    path.write_text(path.read_text().replace("use_cpu: false", "use_cpu: true"))
    found = {(p.path, p.severity): p for p in accelerate_config_problems(path, world_size=2)}
    assert list(found) == [("$.use_cpu", "error")]
    assert "every launched process trains alone" in found[("$.use_cpu", "error")].message


def test_linter_unknown_keys_with_nearest_key_and_line(tmp_path):
    cluster, plan = _plan(gpu="h100-sxm-80gb", engine="fsdp", zero_stage=3)
    text = accelerate_fsdp_yaml(MODEL, cluster, plan).replace("fsdp_reshard_after_forward", "fsdp_reshard_after_foward")
    text += "num_proceses: 2\n"
    path = tmp_path / "a.yaml"
    path.write_text(text)
    lines = text.splitlines()
    problems = {p.path: p for p in accelerate_config_problems(path, world_size=2)}
    typo = problems["$.fsdp_config.fsdp_reshard_after_foward"]
    assert typo.severity == "warning" and "fsdp_reshard_after_forward" in typo.fix
    assert lines[typo.line - 1].strip().startswith("fsdp_reshard_after_foward")
    top = problems["$.num_proceses"]
    assert top.severity == "error" and "'num_processes'" in top.fix and top.line == len(lines)


def test_linter_contradictions_with_the_world_size(tmp_path):
    cluster, plan = _plan(num_gpus=8, gpu="h100-sxm-80gb", engine="fsdp", zero_stage=3, tp=2, sequence_parallel=False,
                          global_batch_size=8)
    path = tmp_path / "a.yaml"
    path.write_text(accelerate_fsdp_yaml(MODEL, cluster, plan))
    found = {(p.path, p.severity) for p in accelerate_config_problems(path, world_size=16, tp=4)}
    assert found == {("$.num_processes", "error"), ("$.parallelism_config", "error"),
                     ("$.parallelism_config.parallelism_config_tp_size", "error")}
    data = yaml.safe_load(path.read_text()) | {"distributed_type": "DEEPSPEED"}
    path.write_text(yaml.safe_dump(data))
    found = {p.path for p in accelerate_config_problems(path, world_size=8, tp=2)}
    assert "$.parallelism_config" in found and "$.fsdp_config" in found  # parallelism_config needs FSDP2


def test_validate_command_on_emitted_accelerate_files(tmp_path, capsys):
    from autotune.cli import main

    cluster, plan = _plan(engine="hf", zero_stage=2)
    path = _write_ds(tmp_path, cluster, plan)
    assert main(["validate", str(path), str(tmp_path / ACCELERATE_DS_CONFIG)]) == 0
    assert "no problems for world size 2" in capsys.readouterr().out
    (tmp_path / "bad.yaml").write_text("- 1\n- 2\n")
    assert main(["validate", str(tmp_path / "bad.yaml"), "--world-size", "2"]) == 2


_BARE = "compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nmixed_precision: {mp}\n{rest}"


def _bare(tmp_path, kind="NO", mp="bf16", rest="num_processes: 1\n") -> Path:
    path = tmp_path / "bare.yaml"
    path.write_text(_BARE.format(kind=kind, mp=mp, rest=rest))
    return path


def test_linter_bare_NO_distributed_type_is_a_warning_not_an_error(tmp_path, capsys):
    from autotune.cli import main

    path = _bare(tmp_path, kind="NO")  # YAML 1.1: False; accelerate 1.16 launches it as NO
    assert yaml.safe_load(path.read_text())["distributed_type"] is False
    [p] = accelerate_config_problems(path, world_size=1)
    assert (p.path, p.severity, p.line) == ("$.distributed_type", "warning", 2)
    assert "YAML boolean false" in p.message and 'distributed_type: "NO"' in p.fix
    assert main(["validate", str(path)]) == 1 and "0 error(s), 1 warning(s)" in capsys.readouterr().out
    path = _bare(tmp_path, kind='"NO"')
    assert accelerate_config_problems(path, world_size=1) == []
    # without num_processes accelerate launch raises (num_processes is set to 1 only for the string NO)
    [p] = accelerate_config_problems(_bare(tmp_path, kind="NO", rest=""), world_size=1)
    assert (p.path, p.severity) == ("$.distributed_type", "error") and "--num_processes" in p.message


def test_linter_bare_no_mixed_precision_is_an_error_naming_the_key(tmp_path, capsys):
    from autotune.cli import main

    path = _bare(tmp_path, kind="MULTI_GPU", mp="no", rest="num_processes: 8\n")
    [p] = accelerate_config_problems(path, world_size=8)
    assert (p.path, p.severity, p.line) == ("$.mixed_precision", "error", 3)
    assert "YAML boolean false" in p.message and "AttributeError" in p.message
    assert 'mixed_precision: "no"' in p.fix
    assert main(["validate", str(path)]) == 1 and "1 error(s)" in capsys.readouterr().out
    assert accelerate_config_problems(_bare(tmp_path, kind="MULTI_GPU", mp='"no"', rest="num_processes: 8\n"),
                                      world_size=8) == []


@pytest.mark.parametrize(("kind", "mp", "rest"), [("NO", "bf16", "num_processes: 1\n"), ("NO", "bf16", ""),
                                                  ('"NO"', "no", "num_processes: 1\n"),
                                                  ('"NO"', '"no"', "num_processes: 1\n")])
def test_accelerates_own_loader_and_launch_agree_with_the_linter_on_bare_booleans(tmp_path, kind, mp, rest):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    path = _bare(tmp_path, kind=kind, mp=mp, rest=rest)
    loaded = load_config_from_file(str(path))  # accelerate's loader keeps the booleans: it never refuses them
    assert (loaded.distributed_type is False) == (kind == "NO") and (loaded.mixed_precision is False) == (mp == "no")
    errors = [p for p in accelerate_config_problems(path, world_size=1) if p.severity == "error"]
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    try:  # what launch_command does before simple_launcher starts the script
        args, _, _ = _validate_launch_command(args)
        assert not (args.multi_gpu or args.use_deepspeed or args.use_fsdp or args.tpu)  # launched as NO
        prepare_simple_launcher_cmd_env(args)
    except (ValueError, AttributeError) as err:
        assert errors, f"accelerate launch raises {err!r}, the linter found no error"
    else:
        assert not errors, f"accelerate launch accepts the file, the linter says {errors}"
