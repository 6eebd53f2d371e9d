"""Linters for the launch side of a job folder: a DeepSpeed hostfile and a launch script.

- hostfile: each line ``HOST slots=N`` (``#`` comments and blank lines skipped), a host at most once, at least one
  host: DeepSpeed 0.19.8's own grammar (``deepspeed/launcher/runner.py`` ``_parse_hostfile``, regex
  ``^(\\S+)\\s+slots=(\\d+)``); the slots add up to the world size.
- launch script (a shell or ``.sbatch`` file that starts a program with no Megatron arguments in it): bash parses it (``bash -n``), and every file it takes from its own folder (``"$SCRIPT_DIR"/NAME``)
  is there.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from autotune.emit.problems import JobSizes, Problem
from autotune.inputs import read_text

__all__ = ["hostfile_problems", "hostfile_job_sizes", "launch_script_problems"]

_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")
_BESIDE = re.compile(r'"\$(?:SCRIPT_DIR|\{SCRIPT_DIR\})"/([A-Za-z0-9_.\-]+)')
MAX_SLOTS = 1 << 20
"""No node has more ranks than this; a larger count is a typo."""


def _hosts(path: str | Path) -> tuple[dict[str, int], list[Problem]]:
    text = read_text(path, subject=f"hostfile {str(path)!r}")
    hosts: dict[str, int] = {}
    problems: list[Problem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOST_LINE.match(line)
        if match is None:
            problems.append(Problem(path=line[:80], line=number, severity="error", source="deepspeed",
                                    message="not a hostfile line: DeepSpeed reads 'HOST slots=N' only",
                                    fix="write the host, a blank, then slots=<ranks on it>, e.g. 'node1 slots=8'"))
            continue
        host, digits = match.group(1), match.group(2)
        slots = int(digits) if len(digits) <= 9 else MAX_SLOTS + 1
        if host in hosts:
            problems.append(Problem(path=host, line=number, severity="error", source="deepspeed",
                                    message=f"host {host} is listed twice: DeepSpeed refuses the hostfile",
                                    fix="list each host once, with all its slots"))
        elif not 0 < slots <= MAX_SLOTS:
            problems.append(Problem(path=host, line=number, severity="error", source="rules",
                                    message=f"slots={digits[:24]} is not a rank count (1..{MAX_SLOTS:,})",
                                    fix="give the number of GPUs (ranks) on that host"))
        else:
            hosts[host] = slots
    if not hosts and not problems:
        problems.append(Problem(path="$", severity="error", source="deepspeed", message="the hostfile lists no host",
                                fix="one line per node: 'node1 slots=8'"))
    return hosts, problems


def hostfile_job_sizes(path: str | Path) -> JobSizes:
    """The world size a hostfile gives (its slots added up), or none when it cannot be read as one."""
    hosts, problems = _hosts(path)
    return JobSizes(world_size=sum(hosts.values()) if hosts and not problems else None)


def hostfile_problems(path: str | Path, *, world_size: int) -> list[Problem]:
    hosts, problems = _hosts(path)
    total = sum(hosts.values())
    if hosts and not problems and total != world_size:
        problems.append(Problem(path="$", severity="error", source="rules",
                                message=f"the hosts' slots add up to {total} ranks, the job has {world_size}",
                                fix=f"make the slots add up to {world_size}, or check with --world-size {total}"))
    return problems


def launch_script_problems(path: str | Path) -> list[Problem]:
    text = read_text(path, subject=f"launch script {str(path)!r}")
    problems: list[Problem] = []
    bash = shutil.which("bash")
    if bash is not None:
        proc = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["bash -n failed"])[0]
            problems.append(Problem(path="$", severity="error", source="bash", message=f"bash cannot parse it: {first}",
                                    fix="fix the line bash names"))
    folder = Path(path).parent
    for number, line in enumerate(text.splitlines(), start=1):
        for name in _BESIDE.findall(line):
            if not (folder / name).exists():
                problems.append(Problem(path=name, line=number, severity="error", source="rules",
                                        message=f"it runs with {name} from its own folder, which has none",
                                        fix=f"keep {name} beside the script (emit writes them together)"))
    if not problems and not _LAUNCHES.search(text):  # `echo hello`, or a file of settings another script sources
        problems.append(Problem(path="$", severity="warning", source="rules",
                                message="no launch line (torchrun / deepspeed / srun / python ... SCRIPT.py) and no "
                                        "Megatron arguments in arrays or --flag lines: nothing was checked",
                                fix="validate the script that launches the job (a file another one sources is "
                                    "checked with it), or give --kind"))
    return problems


_LAUNCHES = re.compile(r"(?m)^[^#\n]*\b(?:torchrun|deepspeed|srun|mpirun|accelerate|python3?|torch\.distributed\.run"
                       r"|sbatch|bash|sh)\b[^\n]*")  # a launcher, or a script that runs another
