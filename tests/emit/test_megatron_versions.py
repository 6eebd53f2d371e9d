"""One Megatron-core flag table per modelled release: the tables differ where the releases differ, emitted
arguments pass validate under each release, a flag of another release is a version mismatch, and (where the
megatron-core 0.19.2 wheel can be installed into the test tooling) the 0.19 table is that wheel's parser exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.api import make_plan
from autotune.cli import main as cli_main
from autotune.emit.megatron import megatron_args
from autotune.emit.megatron_flags import (
    MEGATRON_CORE_RELEASES,
    megatron_flag_table,
    megatron_table_source,
    releases_with_flag,
)
from autotune.emit.megatron_lint import megatron_args_problems
from autotune.emit.megatron_versions import header_release, missing_flag_rules
from autotune.emit.options import EmitOptions
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

REPO = Path(__file__).resolve().parents[2]

# (flag, releases whose parser has it), read in each release's source:
# --use-legacy-models: megatron/training/arguments.py of core_v0.16.1 and core_v0.17.1, gone in core_v0.18.2;
# --rl-parallel-generation-tasks: arguments.py of core_v0.16.1 .. core_v0.18.2, gone in core_v0.19.0;
# --moe-ncclep-static-shape: a TransformerConfig field (transformer_config.py:952 of core_v0.19.0, absent before),
# which arguments.py turns into a flag: why the tables come from each release's whole tree.
FLAG_HISTORY = [("--use-legacy-models", ("0.16", "0.17")),
                ("--rl-parallel-generation-tasks", ("0.16", "0.17", "0.18")),
                ("--moe-ncclep-static-shape", ("0.19",)),
                ("--tensor-model-parallel-size", MEGATRON_CORE_RELEASES)]

PLANS = [("llama3-8b", "h100-sxm-80gb", 8, dict(tp=2, global_batch_size=64, zero_stage=1, engine="megatron")),
         ("llama3-70b", "h100-sxm-80gb", 64, dict(tp=8, pp=4, vpp=2, global_batch_size=16, zero_stage=1,
                                                  engine="megatron")),
         ("mixtral-8x7b", "h100-sxm-80gb", 64, dict(tp=1, ep=8, global_batch_size=256, zero_stage=1,
                                                    engine="megatron", precision="fp8"))]


@pytest.mark.parametrize("flag,releases", FLAG_HISTORY, ids=[f for f, _ in FLAG_HISTORY])
def test_the_tables_differ_where_the_releases_differ(flag, releases):
    assert releases_with_flag(flag) == releases


def test_each_table_names_its_source_and_the_releases_grow():
    sizes = [len({s.name for s in megatron_flag_table(r).values()}) for r in MEGATRON_CORE_RELEASES]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes), sizes
    for release, tag in zip(MEGATRON_CORE_RELEASES, ("core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "0.19.2")):
        assert tag in megatron_table_source(release)


@pytest.mark.parametrize("release", MEGATRON_CORE_RELEASES)
@pytest.mark.parametrize("case", PLANS, ids=[p[0] for p in PLANS])
def test_emitted_arguments_pass_validate_under_each_release(case, release):
    model, gpu, n, kw = case
    m, c = load_model_preset(model), load_cluster(gpu=gpu, num_gpus=n)
    argv = megatron_args(m, c, make_plan(m, c, **kw), EmitOptions(megatron_version=release))
    problems = [p for p in megatron_args_problems(argv, n, release=release) if p.severity == "error"]
    assert not problems, [p.render() for p in problems]


def test_a_flag_the_release_lacks_is_refused_at_emit_with_the_releases_that_have_it():
    rules = missing_flag_rules(["--tensor-model-parallel-size", "2", "--moe-ncclep-static-shape"], "0.16")
    assert len(rules) == 1 and "--moe-ncclep-static-shape" in rules[0]
    assert "Megatron-core 0.19 has it" in rules[0] and "megatron_flags_core_v0.16.json" in rules[0]
    bad_choice = missing_flag_rules(["--attention-backend", "no-such-backend"], "0.19")
    assert len(bad_choice) == 1 and "--attention-backend" in bad_choice[0] and "0.19's parser refuses" in bad_choice[0]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *argv], capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.mark.parametrize("release", MEGATRON_CORE_RELEASES)
def test_emit_and_validate_follow_the_release(tmp_path, release):
    out = tmp_path / "job"
    run = _cli("emit", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--global-batch", "64",
               "--tp", "2", "--engine", "megatron", "--engine-version", release, "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert header_release((out / "megatron_args.sh").read_text()) == release
    run = _cli("validate", str(out / "megatron_args.sh"), "--world-size", "8", "--engine-version", f"megatron={release}")
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_0_19_flag_under_0_16_is_a_version_mismatch(tmp_path):
    m, c = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    argv = megatron_args(m, c, make_plan(m, c, tp=2, global_batch_size=64, zero_stage=1, engine="megatron"))
    path = tmp_path / "megatron_args.sh"
    path.write_text("MEGATRON_ARGS=(\n  " + " ".join(argv) + "\n  --moe-ncclep-static-shape\n)\n")
    run = _cli("validate", str(path), "--world-size", "8", "--engine-version", "megatron=0.16")
    assert run.returncode == 1
    text = run.stdout
    assert "version mismatch: --moe-ncclep-static-shape exists in Megatron-core 0.19 but not in 0.16" in text
    assert "this file is for Megatron-core 0.19" in text and "the version in use is Megatron-core 0.16 (installed: " in text
    assert "unrecognized argument" not in text and "Traceback" not in run.stderr
    under_19 = _cli("validate", str(path), "--world-size", "8", "--engine-version", "megatron=0.19").stdout
    assert ": 0 error(s)" in under_19 and "mismatch" not in under_19  # (a warning: no CUDA_DEVICE_MAX_CONNECTIONS)


def _wheel_tree(tmp_path: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from bridge_tooling import bridge_path  # the megatron-core 0.19.2 wheel in the test tooling

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "megatron").symlink_to(bridge_path() / "megatron")
    return tree


PROBE = """
import argparse, json, sys, types, importlib.abc, importlib.machinery
from unittest import mock
import torch, torch._dynamo, torch._inductor.compile_fx
class Inert(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] == "triton" else None
    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name); m.__path__, m.__spec__, m.__version__ = [], spec, "3.4.0"; return m
    def exec_module(self, module): pass
sys.meta_path.insert(0, Inert())
import typing, typing_extensions
typing.override = getattr(typing, "override", typing_extensions.override)
from megatron.training import arguments
assert arguments.__file__.startswith(sys.argv[1]), arguments.__file__
parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
print(json.dumps(sorted(o for a in parser._actions for o in a.option_strings if a.dest != "help")))
"""


def test_the_0_19_table_is_the_megatron_core_0_19_2_parser(tmp_path):
    tree = _wheel_tree(tmp_path)
    run = subprocess.run([sys.executable, "-c", PROBE, str(tree)], capture_output=True, text=True, timeout=600,
                         cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    real = set(json.loads(run.stdout.strip().splitlines()[-1]))
    assert real == set(megatron_flag_table("0.19")), (sorted(real - set(megatron_flag_table("0.19"))),
                                                      sorted(set(megatron_flag_table("0.19")) - real))


def test_an_engine_version_of_thousands_of_digits_is_refused_not_a_traceback(capsys):
    # int() refuses strings past 4,300 digits (a ValueError); a release number that long is just not a release
    code = cli_main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8",
                     "--engine", "megatron", "--engine-version", "1" * 5000])
    err = capsys.readouterr().err
    assert code == 2 and "is not a release autotune models" in err and "Traceback" not in err
