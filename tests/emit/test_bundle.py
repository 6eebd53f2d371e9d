"""`autotune emit`: every file for a plan, written atomically, each reloading."""

import json
import shutil
import subprocess

import pytest

from autotune.api import estimate_from_dict
from autotune.bundle.writer import render_bundle, write_bundle
from autotune.cli import main
from autotune.emit.options import EmitOptions, LaunchOptions
from autotune.errors import InputError
from autotune.recipebook import load_recipe, recipe_estimate, recipe_names


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_emits_files_that_reload(name, tmp_path):
    est = recipe_estimate(load_recipe(name))
    paths = write_bundle(est, tmp_path / "job", EmitOptions())
    names = {p.name for p in paths}
    assert {"plan.md", "plan.json", "launch_torchrun.sh", "launch_slurm.sbatch"} <= names
    engine_files = {"deepspeed": {"ds_config.json"}, "hf": {"ds_config_hf.json", "accelerate_config.yaml"},
                    "megatron": {"megatron_args.sh"}, "fsdp": set(),
                    "megatron-deepspeed": {"ds_config.json", "megatron_deepspeed_args.sh"}}[est.plan.engine]
    assert engine_files <= names
    if "ds_config.json" in names:
        ds = json.loads((tmp_path / "job" / "ds_config.json").read_text())
        autotp = (ds.get("tensor_parallel") or {}).get("autotp_size", 1)  # DeepSpeed counts AutoTP ranks
        assert ds["train_batch_size"] == est.plan.global_batch_size * autotp
    for p in paths:
        if p.suffix in (".sh", ".sbatch"):
            assert subprocess.run(["bash", "-n", str(p)]).returncode == 0
    # plan.json rebuilds the same estimate
    doc = json.loads((tmp_path / "job" / "plan.json").read_text())
    again = estimate_from_dict(doc)
    assert again.plan == est.plan and again.time.step_time_s == est.time.step_time_s


def test_existing_folder_needs_force_and_nothing_half_written(tmp_path):
    est = recipe_estimate(load_recipe("cpu-demo"))
    out = tmp_path / "job"
    write_bundle(est, out)
    with pytest.raises(InputError, match="--force"):
        write_bundle(est, out)
    (out / "marker").write_text("old")
    notes = []
    write_bundle(est, out, force=True, notes=notes)
    assert not (out / "marker").exists()
    # a file emit does not write is never deleted: the previous folder is kept aside, and the notes say where
    (kept,) = tmp_path.glob(".job.old-*/job/marker")
    assert kept.read_text() == "old" and str(kept.parent) in notes[0]
    shutil.rmtree(kept.parent.parent)
    write_bundle(est, out, force=True, notes=notes)  # only emit's own files: replaced, nothing kept
    assert len(notes) == 1
    # a failure while rendering leaves neither the target nor a temporary folder behind
    bad = EmitOptions(launch=LaunchOptions(hosts=("node1", "bad\nhost")))
    with pytest.raises(InputError):
        write_bundle(est, tmp_path / "other", bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


def test_hostile_names_are_quoted_or_refused(tmp_path):
    est = recipe_estimate(load_recipe("llama3-70b-128xh100"))
    evil = f"x$(touch {tmp_path}/pwned); rm -rf ~"
    # The deepspeed runner hands host names to pdsh unquoted: a hostile one is refused, naming the way out.
    hosts = tuple(f"node{i}" for i in range(15)) + (evil,)
    with pytest.raises(InputError, match="torchrun/SLURM scripts, which quote it"):
        render_bundle(est, EmitOptions(launch=LaunchOptions(hosts=hosts)))
    # Paths and script arguments are quoted in every script.
    options = EmitOptions(launch=LaunchOptions(script=evil + ".py", script_args=(evil, "a'b\"c")))
    files = render_bundle(est, options).files
    for name in ("launch_torchrun.sh", "launch_slurm.sbatch", "launch_deepspeed.sh"):
        script = tmp_path / name
        script.write_text(files[name])
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # Run the torchrun script with a stand-in torchrun that prints its argv: the hostile text arrives as
    # single literal arguments and nothing it contains is executed.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "torchrun"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", str(tmp_path / "launch_torchrun.sh")], capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "MASTER_ADDR": "node0"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)
    assert evil + ".py" in argv and evil in argv and "a'b\"c" in argv
    assert not (tmp_path / "pwned").exists()


def test_emit_cli_from_plan_json(tmp_path, capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "4096",
                 "--global-batch", "64", "--top-k", "2", "--json"]) == 0
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(capsys.readouterr().out)
    assert main(["emit", "--plan-json", str(plan_json), "--candidate", "2", "--out", str(tmp_path / "job")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["emit", "--plan-json", str(plan_json), "--candidate", "9", "--out", str(tmp_path / "j2")]) == 2
    assert "candidates" in capsys.readouterr().err
    assert main(["emit", "--recipe", "cpu-demo", "--out", str(tmp_path / "job")]) == 2
    assert "--force" in capsys.readouterr().err


def test_missing_parents_are_created_and_unwritable_ones_refused(tmp_path):
    est = recipe_estimate(load_recipe("cpu-demo"))
    write_bundle(est, tmp_path / "a" / "b" / "job")
    assert (tmp_path / "a" / "b" / "job" / "plan.md").is_file()
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        import os

        if os.access(locked, os.W_OK):  # running as root: permissions do not bind, use a file as parent
            blocker = tmp_path / "file"
            blocker.write_text("x")
            target = blocker / "job"
        else:
            target = locked / "job"
        with pytest.raises(InputError, match="choose another --out"):
            write_bundle(est, target)
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("engine,recipe,te", [
    ("fsdp", "torchao-tensorwise", False), ("fsdp", "torchao-rowwise", False), ("fsdp", "torchao-mxfp8", False),
    ("fsdp", None, False),  # the engine's default: torchao tensorwise
    ("megatron", "te-delayed", True), ("megatron", "te-current", True), ("megatron", "te-mxfp8", True),
    ("deepspeed", None, True),  # the engine's default: Transformer Engine's delayed scaling
])
def test_the_te_recipe_file_is_written_for_transformer_engine_recipes_only(engine, recipe, te):
    from autotune.api import estimate, make_plan
    from autotune.engines import engine_for
    from autotune.specs.loading import load_cluster, load_model

    gpu = "b200" if recipe and "mxfp8" in recipe else "h100-sxm-80gb"  # MXFP8 needs Blackwell
    model, cluster = load_model("llama3-8b"), load_cluster(gpu=gpu, num_gpus=8)
    plan = make_plan(model, cluster, seq_len=4096, global_batch_size=8, micro_batch_size=1, precision="fp8",
                     engine=engine, zero_stage=1 if engine != "fsdp" else 3, fp8_recipe=recipe)
    assert (plan.fp8_recipe or engine_for(plan).comm.fp8_recipe).startswith("te-") is te
    files = render_bundle(estimate(model, cluster, plan)).files
    assert ("te_fp8_recipe.py" in files) is te
    if te:
        compile(files["te_fp8_recipe.py"], "te_fp8_recipe.py", "exec")
    assert ("te_fp8_recipe" in files["plan.md"]) is te  # plan.md names only the files written
