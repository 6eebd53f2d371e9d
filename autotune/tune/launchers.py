"""How a trial's ranks are started: torchrun, the DeepSpeed launcher, or SLURM (``--launcher``).

A :class:`Launcher` answers two questions: :meth:`Launcher.problems`, what is wrong before any trial
runs (missing binaries, a hostfile naming hosts that do not resolve or do not answer ssh, an
allocation too small), and :meth:`Launcher.prefix`, the argv that starts a trial's
``plan.world_size`` ranks of a Python program whose own argv follows (``-m module ...`` or
``script.py ...``, see :func:`autotune.tune.launch.command_line`). :meth:`Launcher.review` lets a
launcher turn what it knows about a failed run (SLURM's time limit, an ``scancel``) into the trial's
state and reason.

- ``torchrun``: ``python -m torch.distributed.run --nproc_per_node N`` on this machine (the default).
- ``deepspeed``: DeepSpeed 0.19.8's runner (``deepspeed/launcher/runner.py``). Without ``--hostfile``:
  ``--num_nodes 1 --num_gpus N`` on localhost (on CPU the runner counts devices from ``LOCAL_SIZE``:
  ``accelerator/cpu_accelerator.py`` device_count). With a hostfile whose hosts (after
  ``--include/--exclude``) are this machine only: ``--no_ssh --node_rank 0``, no ssh at all. Several
  hosts: the runner's pdsh backend over ssh, each host checked first with
  ``ssh -o BatchMode=yes -o ConnectTimeout=3 HOST true``. The hostfile, the filters and the slot
  count are judged by DeepSpeed's own parsers (``_parse_hostfile``, ``parse_inclusion_exclusion``).
- ``slurm``: each trial is an ``srun`` step inside the allocation the tuner runs in
  (``SLURM_JOB_ID`` set), or an ``sbatch`` job when there is none; see
  :mod:`autotune.tune.slurm_step`, which supervises it (per-task logs ``rank-<t>.log``, task exit
  states, ``scancel`` when the trial is stopped).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import math
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from autotune.specs.hardware import ClusterSpec
from autotune.tune.hosts import is_local as _is_local
from autotune.tune.hosts import resolve as _resolve
from autotune.tune.hosts import ssh_problem as _ssh_problem
from autotune.tune.trialspec import TrialResult, TrialSpec

__all__ = ["LaunchSettings", "Launcher", "Torchrun", "DeepSpeedLauncher", "Slurm", "launcher_for", "launch_argv",
           "review", "trial_fields", "LAUNCHERS", "SLURM_RECORD_NAME"]

LAUNCHERS = ("torchrun", "deepspeed", "slurm")
SLURM_RECORD_NAME = "slurm.json"
"""Written by :mod:`autotune.tune.slurm_step` into the trial's folder: job/step ids, per-task states, how it ended."""

SLURM_ENFORCE_SLACK_S = 30.0
"""slurmctld checks time limits every 30 s (PERIODIC_TIMEOUT); seen here: a 1-minute step ended at 73 s."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSettings:
    """What the user chose on the command line (``--launcher --hostfile --include --exclude``)."""

    name: Literal["torchrun", "deepspeed", "slurm"] = "torchrun"
    hostfile: str | None = None
    """deepspeed: an MPI-style hostfile (``host slots=N`` lines)."""
    include: str = ""
    """deepspeed: ``NODE_SPEC[@NODE_SPEC ...]``, NODE_SPEC = ``NAME[:SLOT[,SLOT ...]]`` (DeepSpeed's syntax)."""
    exclude: str = ""


class Launcher(abc.ABC):
    """Starts the ranks of one trial. Subclasses: :class:`Torchrun`, :class:`DeepSpeedLauncher`, :class:`Slurm`."""

    name: ClassVar[str]

    def __init__(self, settings: LaunchSettings) -> None:
        self.settings = settings

    @abc.abstractmethod
    def prefix(self, spec: TrialSpec) -> list[str]:
        """The argv that starts ``spec.plan.world_size`` ranks of the Python program whose argv follows."""

    def problems(self, cluster: ClusterSpec, workload_kind: str) -> list[str]:
        """What stops this launcher from running the study's trials, found before the first one."""
        out = []
        s = self.settings
        if self.name != "deepspeed" and (s.hostfile or s.include or s.exclude):
            out.append(f"--hostfile/--include/--exclude are for --launcher deepspeed, not {self.name}")
        if self.name != "torchrun" and workload_kind == "command":
            out.append(f"--launcher {self.name}: a --workload command starts its own ranks (its template holds "
                       "the launcher); use the builtin or script workload, or put the launcher in the command")
        return out

    def review(self, spec: TrialSpec, result: TrialResult) -> TrialResult:
        """The trial's result with what the launcher knows about how it ended (default: unchanged)."""
        return result

    def after_stop(self, spec: TrialSpec) -> None:
        """Called once the tuner has ended a trial's local processes early (stop, timeout, Ctrl-C): end what the
        launcher started elsewhere (default: nothing; its processes were all local)."""
        del spec


def _python() -> list[str]:
    return [sys.executable]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Torchrun(Launcher):
    """torchrun on this machine: exactly what trials always ran."""

    name = "torchrun"

    def prefix(self, spec: TrialSpec) -> list[str]:
        return _python() + ["-m", "torch.distributed.run", "--nproc_per_node", str(spec.plan.world_size),
                            "--master_addr", "127.0.0.1", "--master_port", str(_free_port())]


# --------------------------------------------------------------------------------------------- DeepSpeed


class DeepSpeedLauncher(Launcher):
    """DeepSpeed's runner, ``python -m deepspeed.launcher.runner`` (what the ``deepspeed`` command runs)."""

    name = "deepspeed"

    def _active(self, world_size: int) -> tuple[dict[str, list[int]] | None, list[str]]:
        """DeepSpeed's active resources {host: slots} for the settings, or None and the problems."""
        # DeepSpeed's logger writes to the stdout it sees at import: keep --json's stdout clean
        with contextlib.redirect_stdout(sys.stderr):
            from deepspeed.launcher.runner import _parse_hostfile, parse_inclusion_exclusion

        s = self.settings
        if s.hostfile:
            from deepspeed.launcher.runner import logger as runner_logger

            from autotune.errors import InputError
            from autotune.inputs import read_text

            max_slots, max_total = 4096, 2**20  # per host (no machine has more); in all (--num-gpus' own limit)
            try:  # a regular file only and at most 1 MiB: a FIFO would block, /dev/zero would never end
                text = read_text(s.hostfile, subject=f"--hostfile {s.hostfile}", max_bytes=2**20)
            except InputError as e:
                return None, [f"--hostfile {s.hostfile}: {p}" for p in e.problems]
            runner_logger.disabled = True  # it logs the whole file on a bad line; the problem below names the line
            try:
                pool = _parse_hostfile(text.splitlines())
            except ValueError as e:
                return None, [f"--hostfile {s.hostfile}: {str(e)[:300]} (lines are 'HOST slots=N')"]
            finally:
                runner_logger.disabled = False
            big = [f"{host} slots={n}" if n < 10**12 else f"{host} slots={str(n)[:12]}... ({len(str(n))} digits)"
                   for host, n in pool.items() if n > max_slots]
            if big:
                return None, [f"--hostfile {s.hostfile}: {', '.join(big[:3])}: more slots than a machine has (at most "
                              f"{max_slots:,} a host); give each host its number of GPUs"]
            if sum(pool.values()) > max_total:
                return None, [f"--hostfile {s.hostfile}: {sum(pool.values()):,} slots in all, more than {max_total:,}; "
                              "give each host its number of GPUs"]
        else:
            pool = {"localhost": world_size}
        try:
            active = parse_inclusion_exclusion(pool, s.include, s.exclude)
        except (ValueError, KeyError) as e:
            return None, [f"--include/--exclude: {e}"]
        return {h: list(slots) for h, slots in active.items()}, []

    def problems(self, cluster: ClusterSpec, workload_kind: str) -> list[str]:
        out = super().problems(cluster, workload_kind)
        active, bad = self._active(cluster.num_gpus)
        out += bad
        if active is None:
            return out
        total = sum(len(v) for v in active.values())
        if total != cluster.num_gpus:
            where = f"the hostfile {self.settings.hostfile}" if self.settings.hostfile else "localhost"
            out.append(f"--launcher deepspeed: {where} (after --include/--exclude) gives {total} slots "
                       f"({', '.join(f'{h}: {len(v)}' for h, v in active.items())}) but each trial runs "
                       f"{cluster.num_gpus} ranks (--num-gpus); pick {cluster.num_gpus} slots with --include")
        unresolved = [h for h in active if _resolve(h) is None]
        if unresolved:
            out.append(f"--hostfile {self.settings.hostfile}: host(s) {', '.join(unresolved)} do not resolve "
                       "(not in DNS or /etc/hosts); fix the names or drop them with --exclude")
            return out
        if self._remote(active):
            if shutil.which("pdsh") is None:
                out.append("--launcher deepspeed across hosts runs ranks through pdsh, which is not on PATH "
                           "(apt-get install pdsh)")
            for host in active:
                if _is_local(_resolve(host) or set()):
                    continue
                why = _ssh_problem(host)
                if why:
                    out.append(f"--hostfile {self.settings.hostfile}: host {host} is not reachable by ssh without "
                               f"a password ({why}); set up keys (ssh-copy-id {host}) or --exclude it")
        return out

    def _remote(self, active: dict[str, list[int]]) -> bool:
        """True when the ranks go beyond this machine (more than one host, or one host that is not local)."""
        if len(active) > 1:
            return True
        (host,) = active
        return not _is_local(_resolve(host) or set())

    def prefix(self, spec: TrialSpec) -> list[str]:
        s, n = self.settings, spec.plan.world_size
        argv = _python() + ["-m", "deepspeed.launcher.runner"]
        env: list[str] = []
        if s.hostfile:
            active, _ = self._active(n)
            argv += ["--hostfile", str(Path(s.hostfile).resolve())]
            argv += [f"--include={s.include}"] if s.include else []
            argv += [f"--exclude={s.exclude}"] if s.exclude else []
            if active is not None and self._remote(active):
                argv += ["--master_addr", next(iter(active)), "--force_multi"]
            else:  # this machine only: no ssh (runner.py: --no_ssh needs --node_rank and --master_addr)
                argv += ["--no_ssh", "--node_rank", "0", "--master_addr", "127.0.0.1"]
        else:
            if s.include or s.exclude:
                argv += [f"--include={s.include}"] if s.include else [f"--exclude={s.exclude}"]
            else:
                argv += ["--num_nodes", "1", "--num_gpus", str(n)]
            argv += ["--master_addr", "127.0.0.1"]
            if spec.cluster.gpu.name == "cpu":
                env = ["env", f"LOCAL_SIZE={n}"]  # the CPU accelerator's device count (cpu_accelerator.py)
        # --no_python: the program is our Python (the builtin's `-m module` or the user's script follows);
        # --no_local_rank: ranks read LOCAL_RANK from the environment, as under torchrun.
        argv += ["--master_port", str(_free_port()), "--no_python", "--no_local_rank", sys.executable]
        return env + argv


# --------------------------------------------------------------------------------------------- SLURM


def slurm_time_limit_min(timeout_s: float) -> int:
    """The step's SLURM time limit: the trial timeout less SLURM's enforcement slack, in whole minutes
    (SLURM's unit), at least 1, so SLURM ends an overlong step on every node before the tuner's own clock."""
    return max(1, math.floor((timeout_s - SLURM_ENFORCE_SLACK_S) / 60))


def slurm_placement(cluster: ClusterSpec, world_size: int) -> tuple[int, int]:
    """(nodes, tasks per node) for ``world_size`` ranks on the cluster's nodes, filled one node at a time."""
    per_node = max(1, min(world_size, cluster.gpus_per_node))
    return math.ceil(world_size / per_node), per_node


def slurm_job_name(workdir: Path) -> str:
    """A name unique to the trial's folder (steps and jobs are found by it for ``scancel``)."""
    import hashlib

    digest = hashlib.sha1(str(Path(workdir).resolve()).encode()).hexdigest()[:8]
    return f"autotune-{Path(workdir).name}-{digest}"


def _controller_problem() -> str | None:
    """What ``scontrol ping`` says where no controller answers (None: one does, or scontrol is absent)."""
    if shutil.which("scontrol") is None:
        return None
    try:
        run = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    said = (run.stdout + run.stderr).strip()
    return None if run.returncode == 0 and "is UP" in said else (said.splitlines() or ["no answer"])[-1][:200]


class Slurm(Launcher):
    """``srun`` steps inside the allocation, or one ``sbatch`` job per trial outside any."""

    name = "slurm"

    @staticmethod
    def in_allocation() -> bool:
        return bool(os.environ.get("SLURM_JOB_ID"))

    def problems(self, cluster: ClusterSpec, workload_kind: str) -> list[str]:
        out = super().problems(cluster, workload_kind)
        nodes, per_node = slurm_placement(cluster, cluster.num_gpus)
        if not self.in_allocation():
            if shutil.which("sbatch") is None:
                out.append("--launcher slurm: not inside a SLURM allocation (SLURM_JOB_ID is unset) and sbatch is "
                           "not on PATH; run autotune inside salloc/sbatch, or install the SLURM client (slurm-wlm)")
            elif (why := _controller_problem()):  # else the first trial fails on it and counts against the study
                out.append(f"--launcher slurm: sbatch cannot reach a SLURM controller ({why}); check slurm.conf "
                           "(SLURM_CONF) and that slurmctld runs (`scontrol ping`), or use --launcher torchrun")
            return out
        if shutil.which("srun") is None:
            out.append("--launcher slurm: inside allocation "
                       f"{os.environ['SLURM_JOB_ID']} but srun is not on PATH")
        have_tasks = os.environ.get("SLURM_NTASKS")
        if have_tasks and have_tasks.isdigit() and int(have_tasks) < cluster.num_gpus:
            out.append(f"--launcher slurm: allocation {os.environ['SLURM_JOB_ID']} has {have_tasks} tasks but each "
                       f"trial runs {cluster.num_gpus} ranks; allocate with -n {cluster.num_gpus} (or more)")
        have_nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
        if have_nodes and have_nodes.isdigit() and int(have_nodes) < nodes:
            out.append(f"--launcher slurm: allocation {os.environ['SLURM_JOB_ID']} has {have_nodes} node(s) but "
                       f"{cluster.num_gpus} ranks at {per_node} per node need {nodes}; allocate with -N {nodes}")
        return out

    def prefix(self, spec: TrialSpec) -> list[str]:
        nodes, per_node = slurm_placement(spec.cluster, spec.plan.world_size)
        params = {
            "mode": "step" if self.in_allocation() else "job",
            "workdir": str(Path(spec.workdir).resolve()),
            "name": slurm_job_name(spec.workdir),
            "nodes": nodes,
            "tasks_per_node": per_node,
            "ntasks": spec.plan.world_size,
            "time_limit_min": slurm_time_limit_min(spec.timeout_s),
            "gpus_per_node": 0 if spec.cluster.gpu.name == "cpu" else per_node,
            "master_port": _free_port(),
            "overlap": bool(os.environ.get("SLURM_STEP_ID")) and os.environ.get("SLURM_STEP_ID") != "batch",
        }
        return _python() + ["-m", "autotune.tune.slurm_step", json.dumps(params, sort_keys=True), "--",
                            sys.executable]

    def after_stop(self, spec: TrialSpec) -> None:
        """The trial's supervisor cancels its job or step when stopped, but a supervisor SIGKILLed while ``sbatch``
        was still submitting (slower than the tuner's kill grace on a busy slurmctld) never learned the job id, and
        the job ran on. So the tuner starts a canceller of its own, in a session of its own (it outlives a Ctrl-C'd
        tuner), that finds the trial's job or step by its unique name and retries until SLURM says it ended."""
        name = slurm_job_name(spec.workdir)
        what = ["step", name, os.environ["SLURM_JOB_ID"]] if self.in_allocation() else ["named", name]
        with contextlib.suppress(OSError):
            subprocess.Popen([sys.executable, "-m", "autotune.tune.slurm_cancel", *what], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def review(self, spec: TrialSpec, result: TrialResult) -> TrialResult:
        """SLURM's word on a failed step: its time limit makes the trial "hung", a cancel names the cancel."""
        try:
            record = json.loads((Path(spec.workdir) / SLURM_RECORD_NAME).read_text())
        except (OSError, ValueError):
            return result
        ended, tasks = record.get("ended"), record.get("tasks") or {}
        states = "; ".join(f"task {t}: {s}" for t, s in sorted(tasks.items(), key=lambda kv: int(kv[0])))
        where = f"SLURM {record.get('kind', 'step')} {record.get('id') or record.get('name')}"
        if result.status in ("completed", "pruned") or record.get("stopped_by_tuner"):
            return result
        extra = f" ({states})" if states else ""
        if ended == "time limit":
            return dataclasses.replace(result, status="hung", reason=(
                f"{where} ran past its time limit ({record.get('time_limit_min')} min) and SLURM ended it: "
                f"{record.get('line', '')}{extra}; log: {result.log_path}"))
        if ended == "cancelled":
            return dataclasses.replace(result, status="crashed", reason=(
                f"{where} was cancelled (scancel, or the allocation ended): {record.get('line', '')}{extra}; "
                f"log: {result.log_path}"))
        if states:
            return dataclasses.replace(result, reason=f"{result.reason}\n{where}: {states}")
        return result


_CLASSES: dict[str, type[Launcher]] = {"torchrun": Torchrun, "deepspeed": DeepSpeedLauncher, "slurm": Slurm}


def launcher_for(settings: LaunchSettings | str | None) -> Launcher:
    """The launcher for the settings (a bare name means no hostfile and no filters)."""
    if settings is None:
        settings = LaunchSettings()
    elif isinstance(settings, str):
        settings = LaunchSettings(name=settings)  # type: ignore[arg-type]
    assert settings.name in _CLASSES, settings.name
    return _CLASSES[settings.name](settings)


def _settings(spec: TrialSpec) -> LaunchSettings:
    return LaunchSettings(name=spec.launcher, hostfile=spec.hostfile, include=spec.include,  # type: ignore[arg-type]
                          exclude=spec.exclude)


def trial_fields(settings: LaunchSettings | str | None) -> dict:
    """The TrialSpec fields (launcher, hostfile, include, exclude) for the settings."""
    s = launcher_for(settings).settings
    return {"launcher": s.name, "hostfile": s.hostfile, "include": s.include, "exclude": s.exclude}


def launch_argv(spec: TrialSpec) -> list[str]:
    """The argv prefix that starts the trial's ranks under ``spec.launcher``."""
    return launcher_for(_settings(spec)).prefix(spec)


def after_stop(spec: TrialSpec) -> None:
    """What the launcher ends elsewhere once the tuner stopped the trial early (``Launcher.after_stop``)."""
    launcher_for(_settings(spec)).after_stop(spec)


def review(spec: TrialSpec, result: TrialResult) -> TrialResult:
    """``result`` with the launcher's word on how the run ended (SLURM time limit / scancel)."""
    return launcher_for(_settings(spec)).review(spec, result)
