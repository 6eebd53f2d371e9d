"""Property test: any argument list and any file contents give exit 0/1/2, no traceback, in bounded time.

Every subcommand is driven in-process (``autotune.cli.main``) with argument lists built from its
own argparse parser (every flag, values good, bad and hostile) and files of random contents
(valid documents, mutated ones, random bytes, deep nesting). ``tune`` gets only arguments that
fail before a study exists: the study function is replaced by one that fails the test.
Deterministic (``derandomize=True``); the number of cases run is printed (``-s``) and asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune import cli

CASE_LIMIT_S = 30.0  # a case slower than this is a hang
EXAMPLES = {"estimate": 600, "plan": 150, "emit": 120, "validate": 250, "recipes": 150, "tune": 250}
COUNTS: dict[str, int] = {}
CODES: dict[str, dict[str, int]] = {}  # command -> how each case ended (argparse usage, exit code)


class Hang(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001
    raise Hang()


# ---- file contents: the valid documents and hostile values bench/hostile_campaign.py draws from too ---------
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from campaign_cases import (  # noqa: E402
    CALIBRATION,
    CLUSTER,
    DS_CONFIG,
    HF,
    HOSTILE_VALUES,
    TINY_MODEL,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@st.composite
def mutated(draw, base: dict) -> dict:
    doc = dict(base)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(sorted(doc) + ["extra", "moe", "launch", "emit", "candidates", "spec"]))
        doc[key] = draw(st.sampled_from(HOSTILE_VALUES) | json_values)
    return doc


def _text(doc) -> str:
    return json.dumps(doc)


# The kinds issue 21's campaign found tracebacks with: numbers no reader holds, nesting a parser recurses on,
# hostfiles with absurd slot counts or repeated hosts, calibrations at the edge of the float range.
HUGE_AND_DEEP = [
    "x = 1" + "0" * 4300 + "\n",                                    # TOML: past Python's int-string limit
    "x = " + "[" * 5000 + "]" * 5000 + "\n",                       # TOML: deep arrays
    "[job]\ndump_folder = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
    '{"train_batch_size": 1e400, "train_micro_batch_size_per_gpu": 1}',     # JSON: infinity as a number
    '{"train_batch_size": ' + "9" * 5000 + "}",                           # JSON: past the int-string limit
    '{"gemm_peak_fraction": 4.9e-324}', '{"gemm_peak_fraction": 999999}', '{"overlap_cost": -0.0}',
    "n1 slots=99999999999999999999\n", "n1 slots=8\nn1 slots=8\n", "n1 slots=0\n", "slots=8\n",
]

file_contents = st.one_of(
    st.builds(_text, mutated(TINY_MODEL)),
    st.builds(_text, mutated(HF)),
    st.builds(_text, mutated(CALIBRATION)),
    st.builds(_text, mutated(DS_CONFIG)),
    st.sampled_from([_text(DS_CONFIG), _text(TINY_MODEL), _text(HF), CLUSTER]),
    st.builds(lambda d: CLUSTER + d, st.sampled_from(["", "num_nodes: 100000000000\n", "intra_node_bandwidth_gb_per_s: .inf\n",
                                                      "? [a, b]\n: 1\n", "x: &a [1]\ny: *a\n", "gpu: 5\n"])),
    st.sampled_from(["", "null", "[1, 2]", '{"candidates": 5}', '{"candidates": [null]}', "{" * 5000,
                     "[" * 100_000, '{"a": NaN}', "\ufeff{}", "key: value", "- a\n- b", "'unterminated",
                     '{"model": {}, "cluster": {}, "plan": {}}']),
    st.builds(_text, json_values),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
    st.sampled_from(HUGE_AND_DEEP),
)

NUMBERS = ["0", "-1", "1", "2", "3", "8", "64", "nan", "inf", "-inf", "1e308", "1" + "0" * 30, "abc", "", "1.5",
           "4096", "1048576", "1048577", "0x10", "1" * 5000]


GOOD_INTS, GOOD_FLOATS = ["1", "2", "4", "8", "16"], ["0", "0.05", "0.5", "1", "3e-4"]
FILE_FLAGS = {"model", "cluster", "calibration", "plan_json", "recipe", "megatron_args", "file"}


@st.composite
def value_for(draw, action: argparse.Action, files: list[str]) -> str:
    """Mostly plausible values (so that cases get past argparse), often hostile ones."""
    if action.choices:
        return draw(st.sampled_from([str(c) for c in action.choices] * 3 + ["bogus", ""]))
    if action.type is not None and action.type is not str and draw(st.integers(0, 9)) < 6:
        return draw(st.sampled_from(GOOD_FLOATS if action.type is float else GOOD_INTS))
    if action.dest in FILE_FLAGS and draw(st.booleans()):
        return draw(st.sampled_from(files))
    kinds = [st.sampled_from(NUMBERS), st.sampled_from(files), st.text(max_size=10),
             st.sampled_from(["tiny-gpt", "tiny-llama", "llama3-8b", "h100-sxm-80gb", "cpu", "cpu-demo", "-x",
                              "--help", "a,b", "bf16,fp8", "1,3", "x=y", "NCCL_A=1", "/dev/null", "/dev/zero",
                              "/nonexistent/x.yaml", "x" * 300, "/proc/autotune-x", "/dev/zero/x",
                              "/".join(["deep"] * 60) + "/x.json", files[0] + "/through-a-file.json"])]
    return draw(st.one_of(*kinds))


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


PARSERS = _parsers()
# tune: flags that cannot start trials, on a GPU this machine lacks. Left out: the workload, storage, resume
# and launcher choices (a launcher runs trials on other hosts, so this machine's GPU count does not stop it).
TUNE_SKIP = {"--storage", "--resume", "--worker", "--workload", "--script", "--command", "--gpu", "--num-gpus",
             "--cluster", "--out", "--calibration", "--study-name", "--launcher", "--hostfile", "--include",
             "--exclude"}


@st.composite
def argv_for(draw, command: str, folder: Path) -> list[str]:
    files = []
    for i in range(draw(st.integers(1, 3))):
        path = folder / f"f{i}{draw(st.sampled_from(['.json', '.yaml', '.yml', '', '.sh', '.toml', '.hostfile']))}"
        path.write_bytes(draw(file_contents).encode("utf-8", "surrogatepass"))
        files.append(str(path))
    options = [a for a in PARSERS[command]._actions if a.option_strings and a.dest not in ("help",)]
    if command == "tune":
        options = [a for a in options if not set(a.option_strings) & TUNE_SKIP]
    argv = [command]
    positional = [a for a in PARSERS[command]._actions if not a.option_strings and a.dest != "help"]
    for action in positional:
        if action.dest == "script_args":
            continue
        if command == "recipes" and action.dest == "names":
            argv += draw(st.lists(st.sampled_from(files + ["cpu-demo", "nope", "-x"]), max_size=2))
        elif command == "recipes" and action.dest == "action":
            argv += draw(st.sampled_from([[], ["list"], ["show"], ["bogus"]]))  # regenerate writes recipes/
        else:
            argv.append(draw(st.sampled_from(files)))
    base = {"estimate": ["--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8"],
            "plan": ["--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--no-offload"],
            "emit": ["--out", str(folder / "job")] + draw(st.sampled_from([
                [], ["--recipe", "cpu-demo"], ["--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2"]])),
            "tune": ["--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--out", str(folder / "t")],
            }.get(command, [])
    if draw(st.booleans()) or command in ("tune", "emit"):
        argv += base
    for action in draw(st.lists(st.sampled_from(options), max_size=6)):
        flag = draw(st.sampled_from(action.option_strings))
        if command == "plan" and flag in ("--min-gpus", "--max-model"):
            continue  # dozens of plan searches each: bench/, not a property test
        if action.nargs == 0:
            argv.append(flag)
        else:
            argv += [flag, draw(value_for(action, files))]
    return argv


def _run(argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse: usage errors 2, --help/--version 0
                code = exc.code
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def _no_study(monkeypatch, tmp_path):
    import autotune.tune.study

    def refuse(*args, **kwargs):
        raise AssertionError("tune started a study: the fuzz test only gives arguments that must fail before one")

    monkeypatch.setattr(autotune.tune.study, "tune", refuse)
    monkeypatch.chdir(tmp_path)  # emit's relative outputs land here


def _check(command: str, argv: list[str]) -> None:
    started = time.monotonic()
    try:
        code, out, err = _run(argv)
    except Hang:
        pytest.fail(f"no answer within {CASE_LIMIT_S} s: autotune {' '.join(argv)[:300]}")
    except Exception as exc:  # noqa: BLE001 - the property: nothing escapes main
        raise AssertionError(f"traceback ({type(exc).__name__}: {exc}) for: autotune {' '.join(argv)[:400]}") from exc
    COUNTS[command] = COUNTS.get(command, 0) + 1
    ending = "usage" if code == 2 and "usage:" in err else str(code)
    if os.environ.get("FUZZ_SHOW") and ending == "usage":
        print(err.strip().splitlines()[-1][:150])
    CODES.setdefault(command, {}).setdefault(ending, 0)
    CODES[command][ending] += 1
    assert code in (0, 1, 2), (code, argv, err[-500:])
    assert "Traceback" not in err, (argv, err[-2000:])
    if "--json" in argv and code == 0 and out.strip():
        json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in --json output: {argv}"))
    assert time.monotonic() - started < CASE_LIMIT_S


@pytest.mark.parametrize("command", list(EXAMPLES))
def test_any_arguments_and_files_give_a_clean_exit(command, tmp_path_factory):
    @settings(max_examples=EXAMPLES[command], derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def prop(data):
        folder = tmp_path_factory.mktemp(command)
        argv = data.draw(argv_for(command, folder))
        _check(command, argv)

    prop()
    print(f"\nfuzz {command}: {COUNTS.get(command, 0)} cases; endings {CODES.get(command)}")
    assert COUNTS.get(command, 0) >= EXAMPLES[command] // 2


def test_special_files_and_outputs(tmp_path):
    """The cases random lists rarely hit: a FIFO (as a model, a cluster, a plan, a hostfile), /dev/zero as a
    hostfile, a dangling --out link, --out ., --out under /proc or too long, a leftover temp folder."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    leftover = tmp_path / ".job.tmp-abc"
    leftover.mkdir()
    os.utime(leftover, (time.time() - 3600,) * 2)
    cases = [["estimate", "--model", str(fifo), "--gpu", "cpu", "--num-gpus", "2"],
             ["estimate", "--model", "tiny-gpt", "--cluster", str(fifo)],
             ["emit", "--plan-json", str(fifo), "--out", str(tmp_path / "a")],
             ["emit", "--recipe", "cpu-demo", "--out", ".", "--force"],
             ["emit", "--recipe", "cpu-demo", "--out", str(tmp_path / "dangling"), "--force"],
             ["validate", str(fifo)], ["recipes", "show", str(fifo)]]
    tune = ["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "256"]
    cases += [[*tune, "--out", str(tmp_path / "t"), "--launcher", "deepspeed", "--hostfile", hostfile]
              for hostfile in (str(fifo), "/dev/zero")]
    cases += [[*tune, "--out", out] for out in ("/proc/autotune-fuzz", str(tmp_path / ("o" * 300)))]
    for argv in cases:
        code, _, err = _run(argv)
        assert code == 2 and "Traceback" not in err, (argv, err)
        assert any(word in err for word in ("FIFO", "--out", "fifo", "character device")), (argv, err)
    code, out, err = _run(["emit", "--recipe", "cpu-demo", "--out", str(tmp_path / "job")])
    assert code == 0, err
    assert "removed" in err and not leftover.exists()
    assert not list(tmp_path.glob(".job.*"))
