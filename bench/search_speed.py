"""How fast the planner answers the commands users run, timed as they run them: each command in a fresh process.

    python bench/search_speed.py            # every command below
    python bench/search_speed.py --quick    # skip --min-gpus / --max-model

CPU seconds are the child's user + sys time (``resource.getrusage(RUSAGE_CHILDREN)`` before and after), the
measure the targets of issue 20 item 6 are set in; wall seconds depend on what else the machine runs. "space" is
the number of plans the search enumerated (the plan command's ``searched N plans`` line). The children run with
bytecode caches (``PYTHONPYCACHEPREFIX`` in a temporary folder, filled by one untimed import first), as an
installed package runs; with ``PYTHONDONTWRITEBYTECODE=1`` every run compiles the package again (~0.25 s).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN_405B = ["plan", "--model", "llama3-405b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16384", "--seq-len", "8192",
             "--global-batch", "2048"]
ESTIMATE = ["estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--tp", "8", "--pp",
            "2", "--zero", "1", "--micro-batch", "1", "--global-batch", "512", "--seq-len", "8192", "--recompute",
            "selective", "--engine", "megatron"]
# (arguments of `python -m autotune`, CPU-second target, part of --quick)
COMMANDS = (
    (["--help"], 0.3, True),
    (ESTIMATE, 0.5, True),
    (PLAN_405B, 2.0, True),
    (["plan", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "128", "--seq-len", "8192",
      "--global-batch", "1024"], 2.0, True),
    (["plan", "--model", "llama3-405b", "--gpu", "h100-sxm-80gb", "--seq-len", "8192", "--min-gpus"], 5.0, False),
    (["plan", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--seq-len", "8192", "--max-model"], 5.0, False),
)
SEARCHED = re.compile(r"searched ([\d,]+) plans")


def child_env(cache: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPYCACHEPREFIX=cache, PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float, str, int]:
    """(CPU s, wall s, stdout, exit code) of ``python -m autotune ARGS`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "autotune", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.stdout, proc.returncode


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    with tempfile.TemporaryDirectory(prefix="autotune-pycache-") as cache:
        env = child_env(cache)
        subprocess.run([sys.executable, "-c", "import autotune.cli, autotune.api, autotune.legend, autotune.report, "
                        "autotune.search.capacity, autotune.commands.emit, autotune.commands.tune"],
                       cwd=ROOT, env=env, check=True)  # fill the bytecode cache, untimed
        print(f"{'command':<100} {'space':>11} {'CPU s':>7} {'wall s':>7} {'target':>7}  result")
        failed = 0
        for args, target, in_quick in COMMANDS:
            if quick and not in_quick:
                continue
            cpu, wall, out, code = timed(args, env)
            found = SEARCHED.search(out)
            space = found.group(1) if found else "-"
            ok = code == 0 and cpu < target
            failed += not ok
            command = "autotune " + " ".join(args)
            print(f"{command[:100]:<100} {space:>11} {cpu:>7.2f} {wall:>7.2f} {target:>7.1f}  "
                  f"{'pass' if ok else 'FAIL' if code == 0 else f'exit {code}'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
