"""Engine versions: the releases each engine declares, --engine-version's default / explicit / unmodelled forms, and
the file formats that follow it (torchtitan TOML vs config module, the Megatron-core release in megatron_args.sh)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import autotune.specs.engine_versions as ev
from autotune.specs.engine_versions import nearest_release, parse_engine_version_flag, release_of, resolve_version
from autotune.engines import ENGINES
from autotune.errors import InputError

DECLARED = {"deepspeed": ("deepspeed", ("0.19",)), "megatron": ("megatron-core", ("0.16", "0.17", "0.18", "0.19")),
            "megatron-deepspeed": ("deepspeed", ("0.19",)), "fsdp": ("torchtitan", ("0.2", "0.3")),
            "hf": ("transformers", ("5",))}
SMALL = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--global-batch", "64"]


def _cli(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *argv], capture_output=True, text=True, timeout=300,
                          cwd=cwd, check=False)


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_each_engine_declares_its_releases(name):
    versions = ENGINES[name].versions
    assert (versions.package, versions.modelled) == DECLARED[name]
    assert versions.newest == versions.modelled[-1]
    if name in ("fsdp", "hf"):
        assert ("accelerate", "1.16") in versions.companions


def test_every_engine_declares_versions():
    assert set(ENGINES) == set(DECLARED)


def test_release_matching_and_nearest():
    mcore = ENGINES["megatron"].versions
    assert release_of("0.19.2", mcore) == "0.19" and release_of("0.16.0rc1", mcore) == "0.16"
    assert release_of("0.15.3", mcore) is None and release_of("0.1", mcore) is None and release_of("x", mcore) is None
    assert release_of("5.24.0", ENGINES["hf"].versions) == "5" and release_of("4.57.1", ENGINES["hf"].versions) is None
    assert nearest_release("0.15.2", mcore) == "0.16"
    assert nearest_release("0.20.0", mcore) == "0.19" and nearest_release("1.0", mcore) == "0.19"
    assert nearest_release("0.17.9", mcore) == "0.17"


def test_default_is_the_installed_release_where_modelled_else_the_newest(monkeypatch):
    mcore = ENGINES["megatron"].versions
    monkeypatch.setattr(ev, "installed_version", lambda package: None)
    assert resolve_version(mcore, None, engine="megatron") == ("0.19", "the newest modelled")
    monkeypatch.setattr(ev, "installed_version", lambda package: "0.17.1" if package == "megatron-core" else None)
    assert resolve_version(mcore, None, engine="megatron")[0] == "0.17"
    monkeypatch.setattr(ev, "installed_version", lambda package: "0.14.0")
    release, why = resolve_version(mcore, None, engine="megatron")
    assert release == "0.19" and "0.14.0 is not modelled" in why and "nearest 0.16" in why
    assert resolve_version(mcore, "0.18.2", engine="megatron") == ("0.18", "asked for")


def test_an_unmodelled_release_names_the_modelled_ones_and_the_nearest():
    with pytest.raises(InputError) as err:
        resolve_version(ENGINES["fsdp"].versions, "0.1.0", engine="fsdp")
    assert "0.2, 0.3" in str(err.value) and "nearest is 0.2" in str(err.value)


def test_the_flag_forms():
    declared = {n: e.versions for n, e in ENGINES.items()}
    assert parse_engine_version_flag("0.18", ["megatron"], declared) == {"megatron": "0.18"}
    assert parse_engine_version_flag("megatron=0.16.1,fsdp=0.2", ["megatron", "fsdp"], declared) == {
        "megatron": "0.16", "fsdp": "0.2"}
    with pytest.raises(InputError, match="ENGINE=VERSION"):
        parse_engine_version_flag("0.18", ["megatron", "fsdp"], declared)
    with pytest.raises(InputError, match="not an engine"):
        parse_engine_version_flag("torch=2.13", ["fsdp"], declared)


def test_cli_unmodelled_release_is_exit_2_naming_the_nearest():
    run = _cli("estimate", *SMALL, "--engine", "megatron", "--tp", "2", "--engine-version", "0.15.2")
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert "0.16, 0.17, 0.18, 0.19" in run.stderr and "nearest is 0.16" in run.stderr
    run = _cli("plan", *SMALL, "--engine", "megatron,fsdp", "--engine-version", "0.18")
    assert run.returncode == 2 and "ENGINE=VERSION" in run.stderr and "Traceback" not in run.stderr


def test_cli_explicit_release_is_said(tmp_path):
    run = _cli("estimate", *SMALL, "--engine", "megatron", "--tp", "2", "--engine-version", "megatron=0.17")
    assert run.returncode == 0, run.stderr
    assert "Megatron-core 0.17 (asked for)" in run.stderr


def test_emit_writes_the_file_format_of_the_release(tmp_path):
    fsdp = [*SMALL, "--engine", "fsdp", "--zero", "3"]
    run = _cli("emit", *fsdp, "--engine-version", "0.2", "--out", str(tmp_path / "v02"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "v02" / "torchtitan_job.toml").exists() and not (tmp_path / "v02" / "torchtitan_plan.py").exists()
    run = _cli("emit", *fsdp, "--engine-version", "fsdp=0.3", "--out", str(tmp_path / "v03"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "v03" / "torchtitan_plan.py").exists() and not (tmp_path / "v03" / "torchtitan_job.toml").exists()
    run = _cli("emit", *fsdp, "--torchtitan-version", "0.3", "--out", str(tmp_path / "alias"))  # the older flag
    assert run.returncode == 0 and (tmp_path / "alias" / "torchtitan_plan.py").exists()
    run = _cli("emit", *fsdp, "--torchtitan-version", "0.3", "--engine-version", "0.2", "--out", str(tmp_path / "x"))
    assert run.returncode == 2 and "disagree" in run.stderr and not (tmp_path / "x").exists()


def test_a_toml_under_torchtitan_0_3_is_a_version_mismatch(tmp_path):
    run = _cli("emit", *SMALL, "--engine", "fsdp", "--zero", "3", "--engine-version", "0.2", "--out", str(tmp_path / "j"))
    assert run.returncode == 0, run.stderr
    toml = str(tmp_path / "j" / "torchtitan_job.toml")
    run = _cli("validate", toml, "--engine-version", "fsdp=0.3")
    assert run.returncode == 1, run.stderr
    assert "version mismatch" in run.stdout and "is for torchtitan 0.2" in run.stdout
    assert "the version in use is torchtitan 0.3 (installed: " in run.stdout and "fix the config" not in run.stdout


@pytest.mark.parametrize("package", ["torch", "deepspeed", "torchtitan", "megatron-core", "transformers", "PyYAML",
                                     "typing_extensions", "no-such-package-autotune"])
def test_the_installed_version_is_what_importlib_metadata_says(package):
    """installed_version reads the .dist-info folder's name (no importlib.metadata import on every command): the same
    answer, installed or not."""
    import importlib.metadata

    try:
        expected = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        expected = None
    assert ev.installed_version(package) == expected
