"""A --command trial's plan as accelerate / torchtitan files and batch numbers: {accelerate_config},
{torchtitan_config}, {micro_batch}, {grad_accum} (autotune/tune/plan_files.py), and the plans they cannot carry."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from autotune.emit.options import EmitOptions
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.tune.launch import command_line, command_template_problem, command_values
from autotune.tune.trial import TrialSpec, Workload, run_trial

accelerate = pytest.importorskip("accelerate")  # a dependency (pyproject)
from accelerate.commands.config.config_args import load_config_from_file  # noqa: E402

ACCELERATE = ("accelerate launch --config_file {accelerate_config} train.py --per_device_train_batch_size {micro_batch} "
              "--gradient_accumulation_steps {grad_accum}")
METRIC = r"took (?P<step_time_s>[0-9.]+) s"


def _spec(tmp_path, command, *, engine="hf", gpu="cpu", model="tiny-gpt", options=None, zero_stage=2):
    plan = ParallelPlan(dp=2, global_batch_size=8, micro_batch_size=2, grad_accum_steps=2, seq_len=64,
                        zero_stage=zero_stage, engine=engine)
    return TrialSpec(model=load_model_preset(model), cluster=load_cluster(gpu=gpu, num_gpus=2), plan=plan,
                     workload=Workload(kind="command", command=command, metric_pattern=METRIC),
                     workdir=tmp_path / "trial", steps=3, warmup_steps=1, timeout_s=30.0, emit_options=options)


def test_an_hf_plans_accelerate_config_is_read_by_accelerate_with_the_plans_batch(tmp_path, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    spec = _spec(tmp_path, ACCELERATE)
    spec.workdir.mkdir()
    values = command_values(spec, spec.workdir / "ds_config.json")
    path = Path(values["accelerate_config"])
    assert path.is_file() and path.parent == spec.workdir.resolve()
    loaded = load_config_from_file(str(path))  # accelerate launch --config_file reads it so
    assert loaded.distributed_type == "DEEPSPEED" and loaded.num_processes == 2 and loaded.mixed_precision is None
    ds_json = Path(loaded.deepspeed_config["deepspeed_config_file"])
    assert ds_json.is_absolute() and ds_json.is_file()  # found from whatever folder the command runs accelerate in
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(loaded.deepspeed_config))
    cfg = DeepSpeedPlugin(hf_ds_config=str(ds_json)).deepspeed_config  # accelerate's own checks of the pair
    assert cfg["zero_optimization"]["stage"] == 2
    assert (values["micro_batch"], values["grad_accum"]) == (2, 2)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (2, 2)
    assert values["micro_batch"] * values["grad_accum"] * spec.plan.dp == spec.plan.global_batch_size \
        == cfg["train_batch_size"]
    text = command_line(spec, spec.workdir / "ds_config.json")[-1]
    assert text == (f"accelerate launch --config_file {path} train.py --per_device_train_batch_size 2 "
                    "--gradient_accumulation_steps 2")


def test_an_fsdp_plans_accelerate_config_is_fsdp2_and_needs_the_batch_placeholders(tmp_path):
    spec = _spec(tmp_path, ACCELERATE, engine="fsdp", gpu="h100-sxm-80gb", zero_stage=3)
    spec.workdir.mkdir()
    values = command_values(spec, spec.workdir / "ds_config.json")
    loaded = load_config_from_file(values["accelerate_config"])
    assert loaded.distributed_type == "FSDP" and loaded.fsdp_config["fsdp_version"] == 2
    assert loaded.fsdp_config["fsdp_reshard_after_forward"] is True and loaded.num_processes == 2
    from autotune.tune.plan_files import trial_plan_problem

    assert trial_plan_problem(spec) is None
    # accelerate's FSDP2 file holds no batch sizes: without them the program would train at its own
    said = trial_plan_problem(dataclasses.replace(spec, workload=Workload(
        kind="command", command="accelerate launch --config_file {accelerate_config} train.py", metric_pattern=METRIC)))
    assert "holds no batch sizes" in said and "{micro_batch}" in said and "{grad_accum}" in said


def test_a_plan_accelerate_cannot_carry_is_not_launched_and_says_why(tmp_path):
    """A DeepSpeed-engine plan under {accelerate_config}: never run as some other plan; the reason names the plan,
    the placeholder, and the engines that work."""
    spec = _spec(tmp_path, "touch ran; " + ACCELERATE, engine="deepspeed")
    r = run_trial(spec)
    assert r.status == "crashed" and r.reason.startswith("not launched: plan tp1 pp1 dp2 ds-zero2"), r.reason
    assert "{accelerate_config} cannot carry an engine deepspeed plan" in r.reason and "--engine hf,fsdp" in r.reason
    assert not (spec.workdir / "ran").exists() and not list(spec.workdir.glob("accelerate*"))
    # on CPU accelerate runs no FSDP: an fsdp plan is refused there too, with accelerate's reason
    r = run_trial(_spec(tmp_path, ACCELERATE, engine="fsdp", zero_stage=3))
    assert r.status == "crashed" and "runs FSDP on GPUs (accelerators) only" in r.reason, r.reason


def test_a_command_trial_receives_the_plans_files_and_batch(tmp_path):
    """End to end: the command sees its accelerate config and the plan's batch numbers."""
    cmd = ("test -f {accelerate_config} && for i in $(seq {steps}); do "
           "echo \"mb {micro_batch} ga {grad_accum} took 0.05 s\"; done")
    spec = _spec(tmp_path, cmd)
    r = run_trial(spec)
    assert r.status == "completed" and r.step_times_s == (0.05, 0.05, 0.05), r.reason
    assert "mb 2 ga 2 took" in (spec.workdir / "trial.log").read_text()


def test_torchtitan_config_is_the_0_2_toml_of_the_trial(tmp_path):
    options = dataclasses.replace(EmitOptions(), torchtitan_version="0.2")
    spec = _spec(tmp_path, "torchrun -m torchtitan.train --job.config_file {torchtitan_config}", engine="fsdp",
                 gpu="h100-sxm-80gb", model="llama3-8b", options=options, zero_stage=3)
    spec.workdir.mkdir()
    path = Path(command_values(spec, spec.workdir / "ds_config.json")["torchtitan_config"])
    toml = tomllib.loads(path.read_text())
    assert toml["training"]["local_batch_size"] == 2 and toml["training"]["global_batch_size"] == 8
    assert toml["training"]["steps"] == 4 and toml["metrics"]["log_freq"] == 1  # the trial's steps, each logged
    from autotune.tune.plan_files import trial_plan_problem

    said = trial_plan_problem(dataclasses.replace(spec, emit_options=None))  # 0.3: a config module, no TOML
    assert "{torchtitan_config} cannot carry" in said and "--engine-version fsdp=0.2" in said


def test_the_plan_carrying_placeholders_and_the_unknown_one():
    assert command_template_problem(ACCELERATE) is None
    assert command_template_problem("run --config {torchtitan_config}") is None
    said = command_template_problem("train.py --per_device_train_batch_size {micro_batch} "
                                    "--gradient_accumulation_steps {grad_accum}")
    assert "names none of {ds_config}, {megatron_args}, {accelerate_config}, {torchtitan_config}, {workdir}" in said
    said = command_template_problem("train.sh {nosuch}")
    assert ("{nproc}, {ds_config}, {workdir}, {steps}, {megatron_args}, {accelerate_config}, {torchtitan_config}, "
            "{micro_batch}, {grad_accum}") in said


def test_tune_refuses_a_command_that_carries_none_of_the_feasible_plans(tmp_path, capsys):
    """Only DeepSpeed-engine plans searched (the default), {accelerate_config} named: exit 2 before any study,
    saying why and which engines to tune."""
    from autotune.cli import main

    rc = main(["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--out",
               str(tmp_path / "o"), "--workload", "command", "--command", ACCELERATE, "--metric-pattern", METRIC])
    err = capsys.readouterr().err
    assert rc == 2 and "runs none of the" in err and "--engine hf,fsdp" in err, err
    assert not (tmp_path / "o").exists()


def test_tune_names_a_hugging_face_models_decoder_layer_for_accelerates_fsdp2_wrap(tmp_path, monkeypatch, capsys):
    """tune --model CONFIG.json: the trials' FSDP2 YAML wraps the model's decoder layer (as emit writes it), not
    autotune's built-in Block, which accelerate would not find in a transformers model."""
    from autotune.cli import main
    from autotune.errors import InputError
    from autotune.tune import study as study_mod

    seen = {}

    def fake_tune(*args, **kw):
        seen.update(kw)
        raise InputError(["stopped by the test"], subject="tune")

    monkeypatch.setattr(study_mod, "tune", fake_tune)
    config = Path(__file__).parents[1] / "fixtures" / "hf" / "phi3-mini" / "config.json"
    rc = main(["tune", "--model", str(config), "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--out",
               str(tmp_path / "o"), "--workload", "command", "--command", ACCELERATE, "--metric-pattern", METRIC])
    assert rc == 2 and "stopped by the test" in capsys.readouterr().err
    assert seen["emit_options"].launch.wrap_class == "Phi3DecoderLayer"
