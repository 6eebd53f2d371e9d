"""Issue 21, the contract against hostile inputs: bad input gets a clear error naming the problem and the way out
(exit 2), never a traceback or a hang, and nothing the user has is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.cli import main


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def refused(argv, capsys, *needles):
    code, out, err = run(argv, capsys)
    assert code == 2, (argv, code, err)
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# ---- emit --force: the previous folder is never lost ----------------------------------------------------------

def _emit(out: Path, capsys, *extra):
    code, _, err = run(["emit", "--recipe", "cpu-demo", "--out", str(out), *extra], capsys)
    assert code == 0, err
    return err


def test_force_keeps_a_folder_holding_the_users_files_aside_and_says_where(tmp_path, capsys):
    job = tmp_path / "job"
    _emit(job, capsys)
    (job / "notes.txt").write_text("mine")
    err = _emit(job, capsys, "--force")
    assert not (job / "notes.txt").exists() and (job / "plan.json").exists()
    (kept,) = tmp_path.glob(".job.old-*/job/notes.txt")
    assert kept.read_text() == "mine"
    assert "notes.txt" in err and str(kept.parent) in err
    # the next emit names the aside copy again and never deletes it
    err = _emit(job, capsys, "--force")
    assert kept.exists() and f"kept {kept.parent}" in err
    # a folder holding only emit's own files is replaced without a copy left behind
    for old in tmp_path.glob(".job.old-*"):
        import shutil

        shutil.rmtree(old)
    _emit(job, capsys, "--force")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


_KILLED_EMIT = """
import os, sys
from pathlib import Path
import autotune.bundle.writer as writer
mode, out = sys.argv[1], Path(sys.argv[2])
real_rename = os.rename
if mode == "no-exchange":
    # a system without renameat2: the previous folder aside, then the new one in; killed between the two
    writer._renameat2 = lambda src, dst, flags: False
    def rename(src, dst):
        if Path(dst) == out:
            os._exit(9)
        real_rename(src, dst)
    os.rename = rename
else:
    # killed after the new files took their aside name, before the swap
    def exchange(src, dst, flags):
        os._exit(9)
    writer._renameat2 = exchange
from autotune.cli import main
sys.exit(main(["emit", "--recipe", "cpu-demo", "--out", str(out), "--force"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["no-exchange", "exchange"])
def test_a_kill_inside_emit_force_loses_nothing_and_the_next_emit_says_where_it_is(mode, tmp_path, capsys):
    job = tmp_path / "job"
    _emit(job, capsys)
    (job / "notes.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED_EMIT), mode, str(job)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr
    if mode == "exchange":
        assert (job / "notes.txt").read_text() == "mine"  # the swap never happened: the folder is as it was
    else:
        assert not job.exists()  # the one step without a target folder ...
        (kept,) = tmp_path.glob(".job.old-*/job/notes.txt")  # ... and the previous folder whole beside it
        assert kept.read_text() == "mine"
    err = _emit(job, capsys, "--force")
    (kept,) = tmp_path.glob(".job.old-*/job/notes.txt")  # set aside by the kill, or by this emit's swap
    assert kept.read_text() == "mine" and str(kept.parent) in err
    assert "never deletes it" in err or "emit does not write (notes.txt)" in err
    if mode == "no-exchange":
        assert f"`mv {kept.parent} {job}` puts it back" in err
    assert (job / "plan.json").exists() and not (job / "notes.txt").exists()


def test_the_next_emit_after_a_kill_says_how_to_put_the_folder_back(tmp_path, capsys):
    job = tmp_path / "job"
    _emit(job, capsys)
    (job / "notes.txt").write_text("mine")
    aside = tmp_path / ".job.old-abc123"
    aside.mkdir()
    os.rename(job, aside / "job")  # as a kill between the two renames leaves it
    err = _emit(job, capsys)
    assert f"mv {aside / 'job'} {job}" in err and (aside / "job" / "notes.txt").read_text() == "mine"


# ---- recipe paths that cannot be read ------------------------------------------------------------------------

def test_recipe_path_too_long_or_through_a_file_or_a_fifo_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "fifo.yaml")
    cases = (("a" * 300, "longer than the file system allows"),
             ("/".join(["a" * 200] * 30), "longer than the file system allows"),
             ("afile/x.yaml", "is a file, not a folder"),
             ("fifo.yaml", "FIFO"),
             (str(tmp_path), "folder"))
    for ref in cases:
        for argv in (["emit", "--recipe", ref[0], "--out", "job"], ["recipes", "show", ref[0]]):
            refused(argv, capsys, ref[1], "recipe")
    assert not (tmp_path / "job").exists()


def test_recipe_in_a_folder_we_may_not_enter_is_named(tmp_path, capsys, monkeypatch):
    # Tests run as root, who may enter any folder: the kernel's answer for a user who may not is simulated.
    import errno

    locked = str(tmp_path / "locked")
    real_stat, real_open = os.stat, os.open

    def denied(real):
        def call(path, *args, **kwargs):
            if str(path).startswith(locked):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "stat", denied(real_stat))
    monkeypatch.setattr(os, "open", denied(real_open))
    refused(["recipes", "show", f"{locked}/r.yaml"], capsys, "permission denied", "locked/r.yaml")


# ---- TOML: too long an integer, nested too deep, what torchtitan's own loader raises --------------------------

@pytest.mark.parametrize("body, needle", [
    ("[parallelism]\ntensor_parallel_degree = " + "9" * 5000 + "\n", "an integer of more than 4,300 digits"),
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 32 levels deep"),
    ("x = " + "{a=" * 5000 + "}" * 5000 + "\n", "nested more than 32 levels deep"),
    ("x = " + "[" * 40 + "]" * 40 + "\n", "nested more than 32 levels deep"),
], ids=["5000-digit-int", "5000-deep-arrays", "5000-deep-tables", "40-deep-arrays"])
def test_torchtitan_toml_too_long_an_integer_or_too_deep(body, needle, tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text(body)
    refused(["validate", str(path), "--world-size", "8"], capsys, needle, "torchtitan config")


@pytest.mark.parametrize("name, body", [
    ("bridge_overrides.args", "model.x = " + "[" * 5000 + "]" * 5000 + "\n"),
    ("bridge_overrides.yaml", "model:\n  x: " + "[" * 5000 + "]" * 5000 + "\n"),
], ids=["key-value", "yaml"])
def test_bridge_overrides_nested_too_deep_are_a_problem_not_a_traceback(name, body, tmp_path, capsys):
    # yaml's composer recurses: a value 5,000 levels deep was a RecursionError (hostile campaign seed 67, #1733)
    path = tmp_path / name
    path.write_text(body)
    assert main(["validate", str(path), "--world-size", "8"]) == 1
    out, err = capsys.readouterr()
    assert "nested too deep for an override" in out and "Traceback" not in err


def test_what_torchtitans_own_loader_raises_is_a_problem_not_a_traceback(tmp_path, capsys):
    # torchtitan's ConfigManager asserts (validation steps) and overflows (a path given as a huge integer)
    pytest.importorskip("torchtitan.config")
    import re

    good = Path(__file__).parent / "fixtures" / "realworld" / "good" / "torchtitan_llama3_8b.toml"
    text = good.read_text()
    for pattern, value in ((r"^steps = 1200.*$", "steps = -" + "9" * 400),
                           (r"^hf_assets_path = .*$", "hf_assets_path = 1" + "0" * 400)):
        bad, n = re.subn(pattern, value, text, count=1, flags=re.MULTILINE)
        assert n == 1
        path = tmp_path / "job.toml"
        path.write_text(bad)
        code, out, err = run(["validate", str(path), "--world-size", "8"], capsys)
        assert code == 1 and "Traceback" not in err and "torchtitan's ConfigManager raised" in out + err, out + err


# ---- DeepSpeed JSON numbers no reader can hold ----------------------------------------------------------------

_DS = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
       "zero_optimization": {"stage": 1, "reduce_bucket_size": 500000000},
       "optimizer": {"type": "AdamW", "params": {"lr": 0.0003}}}


@pytest.mark.parametrize("where, literal, needle", [
    (("train_micro_batch_size_per_gpu",), "-1e400", "beyond the largest 64-bit float"),
    (("gradient_accumulation_steps",), "1e400", "beyond the largest 64-bit float"),
    (("zero_optimization", "reduce_bucket_size"), "1e400", "beyond the largest 64-bit float"),
    (("gradient_clipping",), "1" + "0" * 400, "beyond a 64-bit integer"),
    (("optimizer", "params", "lr"), "-1" + "0" * 400, "beyond a 64-bit integer"),
    (("train_micro_batch_size_per_gpu",), "1" + "0" * 400, "beyond a 64-bit integer"),
], ids=["micro-batch--1e400", "accumulation-1e400", "bucket-1e400", "clipping-1e400-int", "lr--1e400-int",
        "micro-batch-1e400-int"])
def test_deepspeed_numbers_beyond_64_bits_are_named_at_their_key(where, literal, needle, tmp_path, capsys):
    import copy
    import json

    data = copy.deepcopy(_DS)
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = "@@"
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(data, indent=2).replace('"@@"', literal))
    code, out, err = run(["validate", str(path), "--world-size", "8"], capsys)
    assert code == 1 and "Traceback" not in err, err
    assert f"$.{'.'.join(where)}" in out and needle in out, out


def test_deepspeed_integer_of_more_than_4300_digits_is_unusable_input(tmp_path, capsys):
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 1' + "0" * 5000 + "}")
    refused(["validate", str(path), "--world-size", "8"], capsys, "an integer of more than 4,300 digits")


def test_a_config_given_as_a_dict_with_an_infinite_or_huge_number_is_checked_not_a_traceback():
    from autotune.emit.validate import validate_deepspeed_config

    for value in (float("inf"), 10**400):
        problems = validate_deepspeed_config(_DS | {"train_batch_size": value}, world_size=8)
        assert any(p.path == "$.train_batch_size" and p.severity == "error" for p in problems), problems


# ---- calibration values outside a physically meaningful range -------------------------------------------------

_ESTIMATE = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--tp", "2", "--zero",
             "1", "--micro-batch", "1", "--global-batch", "64", "--seq-len", "4096"]


@pytest.mark.parametrize("key, value, needle", [
    ("gemm_peak_fraction", "4.9e-324", "gemm_peak_fraction must be a positive number from 0.001 to 1"),
    ("hbm_efficiency", "4.9e-324", "hbm_efficiency must be a positive number from 0.001 to 1"),
    ("link_efficiency", "4.9e-324", "link_efficiency must be a positive number from 0.001 to 1"),
    ("gemm_peak_fraction", "999999", "gemm_peak_fraction must be a positive number from 0.001 to 1 (a fraction of the datasheet GEMM rate; below 0.1% is not a measurement), got 999999"),
    ("gemm_half_dim", "1e6", "gemm_half_dim must be a number from 0 to 10,000"),
    ("overlap_cost", "1.5", "overlap_cost must be a number from 0 to 1"),
    ("overlap_cost", "-0.1", "overlap_cost must be a number from 0 to 1"),
])
def test_calibration_values_outside_their_physical_range_are_refused(key, value, needle, tmp_path, capsys):
    path = tmp_path / "cal.json"
    path.write_text(f'{{"{key}": {value}}}')
    refused([*_ESTIMATE, "--calibration", str(path)], capsys, needle, "drop --calibration")


def test_calibration_values_a_tuning_study_writes_still_load(tmp_path, capsys):
    from autotune.cost.efficiency import BOUNDS, DEFAULT_EFFICIENCY, load_efficiency, save_efficiency

    for changes in ({"gemm_peak_fraction": 1.0, "gemm_half_dim": 150.0}, {"hbm_efficiency": 0.25, "overlap_cost": 0.0},
                    {name: lo for name, (lo, _, _) in BOUNDS.items()}, {name: hi for name, (_, hi, _) in BOUNDS.items()}):
        path = tmp_path / "cal.json"
        save_efficiency(DEFAULT_EFFICIENCY.with_(**changes), str(path))
        assert load_efficiency(str(path)) == DEFAULT_EFFICIENCY.with_(**changes)
    code, out, err = run([*_ESTIMATE, "--calibration", str(path)], capsys)
    assert code == 0 and "Traceback" not in err, err


# ---- hostfiles: bounded, regular files only, slot counts a machine can have -----------------------------------

def _tune(tmp_path, hostfile):
    return ["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--global-batch", "4",
            "--trials", "1", "--out", str(tmp_path / "tune"), "--launcher", "deepspeed", "--hostfile", str(hostfile)]


@pytest.mark.parametrize("body, needle", [
    ("localhost slots=99999999999999999999\n", "slots=999999999999... (20 digits): more slots than a machine has"),
    # (a billion slots was an 8 GB list on the old code: 100,000 shows the bound without that)
    ("localhost slots=100000\n", "localhost slots=100000: more slots than a machine has"),
    ("".join(f"node{i} slots=4096\n" for i in range(300)), "1,228,800 slots in all"),
    ("localhost slots=2\n" + "#" * (2 * 2**20) + "\n", "larger than 1 MiB"),
], ids=["20-digit-slots", "100k-slots", "too-many-in-all", "2-MiB"])
def test_hostfile_slot_counts_and_size_are_bounded(body, needle, tmp_path, capsys):
    path = tmp_path / "hostfile"
    path.write_text(body)
    refused(_tune(tmp_path, path), capsys, needle, f"--hostfile {path}")


@pytest.mark.slow
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_fifo_or_dev_zero_as_hostfile_is_refused_without_hanging(special, tmp_path):
    path = tmp_path / "hostfile"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path = Path(special)
    import resource

    def at_most_8_gib():  # a reader without a bound would fill the machine's memory from /dev/zero
        resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))

    proc = subprocess.run([sys.executable, "-m", "autotune", *_tune(tmp_path, path)], capture_output=True, text=True,
                          timeout=180, preexec_fn=at_most_8_gib)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert ("FIFO" if special == "fifo" else "character device") in proc.stderr and f"--hostfile {path}" in proc.stderr
