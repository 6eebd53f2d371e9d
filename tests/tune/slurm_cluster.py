"""A real single-node SLURM for the tests: munged, slurmctld and slurmd on this machine.

``slurm_cluster`` (session-scoped fixture) writes a ``slurm.conf`` into a temporary folder, starts
its own ``munged`` (own socket), ``slurmctld`` and ``slurmd`` on free, non-default ports, waits until
``sinfo`` shows the node idle, yields a :class:`SlurmCluster` whose ``env`` has ``SLURM_CONF`` set, and
stops the daemons by their pids at the end. The recipe is ../shared/reference/cpu-feasibility.md §7
(Debian's slurm-wlm 22.05.8, run as root, no systemd, no cgroups).

Skipped only when the SLURM binaries are missing outside CI; in CI (``CI=true``) that is a failure,
since ``.ci/run`` installs slurm-wlm.

Choices and why:
- ``SlurmdParameters=config_overrides``: the node declares 8 CPUs on a 2-core machine, so two 2-task
  jobs (two tuner workers) run at once; slurmd would otherwise drain a node whose real core count is
  lower than slurm.conf's (slurm.conf(5), SlurmdParameters).
- ``KillWait=2``: a cancelled or timed-out step gets SIGKILL 2 s after SIGTERM (default 30 s).
- ``AuthInfo=socket=...``: our own munged, so a munged already running on the machine is left alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["SlurmCluster", "slurm_cluster", "slurm_binaries"]

BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "sbatch", "scancel", "squeue")
NODE_CPUS = 8
START_TIMEOUT_S = 30.0


def slurm_binaries() -> dict[str, str | None]:
    """Where each SLURM/munge binary is (None: missing). munged and the daemons live in /usr/sbin."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return {name: shutil.which(name, path=path) for name in BINARIES}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    bins: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF, without any allocation of an outer SLURM job."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout)

    def log_tail(self, n: int = 30) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            p = self.root / name
            if p.is_file():
                out.append(f"--- {name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)


def _write_conf(root: Path, node: str) -> Path:
    ctld_port, slurmd_port = _free_port(), _free_port()
    (root / "state").mkdir()
    (root / "spool").mkdir()
    text = f"""\
ClusterName=autotune-test
SlurmctldHost={node}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root / 'munge.socket'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=2
InactiveLimit=0
MinJobAge=300
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'slurmctld.log'}
SlurmdLogFile={root / 'slurmd.log'}
NodeName={node} CPUs={NODE_CPUS} RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
    conf = root / "slurm.conf"
    conf.write_text(text)
    return conf


def _read_pid(path: Path, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.1)
    raise RuntimeError(f"{path} was not written within {timeout_s:g} s")


def start_cluster() -> SlurmCluster:
    bins = slurm_binaries()
    missing = [k for k, v in bins.items() if v is None]
    if missing:
        raise FileNotFoundError(f"missing SLURM binaries: {', '.join(missing)}")
    if os.geteuid() != 0:
        raise PermissionError("the test SLURM runs its daemons as root (SlurmUser=root)")
    root = Path(tempfile.mkdtemp(prefix="autotune-slurm-", dir="/tmp"))
    node = socket.gethostname().split(".")[0]
    cluster = SlurmCluster(root=root, conf=_write_conf(root, node), node=node, bins=bins)  # type: ignore[arg-type]
    env = cluster.env
    try:
        subprocess.run([bins["munged"], "--force", f"--socket={root / 'munge.socket'}",
                        f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
                        f"--seed-file={root / 'munged.seed'}"], check=True, capture_output=True, env=env)
        cluster.pids["munged"] = _read_pid(root / "munged.pid")
        subprocess.run([bins["slurmctld"], "-f", str(cluster.conf)], check=True, capture_output=True, env=env)
        cluster.pids["slurmctld"] = _read_pid(root / "slurmctld.pid")
        subprocess.run([bins["slurmd"], "-f", str(cluster.conf)], check=True, capture_output=True, env=env)
        cluster.pids["slurmd"] = _read_pid(root / "slurmd.pid")
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            state = cluster.run(bins["sinfo"], "-h", "-o", "%T", check=False).stdout.strip()
            if state == "idle":
                return cluster
            time.sleep(0.3)
        raise RuntimeError(f"sinfo shows {state!r}, not 'idle', {START_TIMEOUT_S:g} s after start\n"
                           + cluster.log_tail())
    except BaseException:
        stop_cluster(cluster)
        raise


def _our_stepds(conf: Path) -> list[int]:
    """slurmstepd processes of this cluster (their environment names our slurm.conf)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() != "slurmstepd":
                continue
            if f"SLURM_CONF={conf}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def stop_cluster(cluster: SlurmCluster) -> None:
    """Cancel what is still queued, SIGTERM each daemon by its pid (slurmd first), SIGKILL what is left after
    10 s, then end this cluster's slurmstepd processes (a step finishing while slurmd stops is orphaned)."""
    if cluster.pids.get("slurmctld"):
        cluster.run("scancel", "--full", "--user=root", check=False, timeout=20)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and cluster.run("squeue", "-h", check=False, timeout=20).stdout.strip():
            time.sleep(0.5)
    for name in ("slurmd", "slurmctld", "munged"):
        pid = cluster.pids.get(name)
        if pid is None:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for pid in _our_stepds(cluster.conf):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = [k for k, v in slurm_binaries().items() if v is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"SLURM binaries missing in CI ({', '.join(missing)}): .ci/run installs slurm-wlm")
        pytest.skip(f"SLURM binaries missing ({', '.join(missing)}): apt-get install -y slurm-wlm")
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
