"""DeepSpeed's JIT-built ops, built once before a study's first trial, and build locks whose owner died.

DeepSpeed 0.19.8 compiles some of its C++ ops on first use (``OpBuilder.jit_load`` ->
``torch.utils.cpp_extension.load``) into ``TORCH_EXTENSIONS_DIR/<op name>`` (default
``~/.cache/torch_extensions/py<ver>_<cpu|cuXY>``). On CPU, measured here
on this project's 2-core CPU machine: ``cpu_adam`` (ZeRO optimizer offload) 59.5 s cold,
CPU ``fused_adam`` 68 s (trials avoid it: ``torch_adam``), and ``deepspeed_shm_comm``, which
``deepspeed.comm``'s TorchBackend loads in every ``init_distributed`` on the CPU accelerator
(deepspeed/comm/torch.py ``build_shm_op``). Built inside a trial, that time counts against the
trial's timeout, and a trial killed mid-build leaves torch's ``lock`` file behind, on which every
later rank sleeps forever (torch's ``FileBaton.wait`` polls for the file to vanish).

So :func:`ensure_ops` builds what a study's plans need in a separate process before the first
trial. A warm machine (every needed ``.so`` present, no lock) is recognised without importing
torch or DeepSpeed, in milliseconds. Each builder records itself (pid, start time, host) in
``<op dir>/autotune-builder-<pid>.json`` before it builds: one record per builder, so a builder that starts
while another holds the lock (and waits for it) never overwrites the record of the one that holds it.

A lock is *live* while a process holds it open (torch keeps the ``O_EXCL`` descriptor open until
it releases the baton; found through ``/proc/<pid>/fd``). A lock nobody holds is dead. It is
*ours* when one of our builder records names a process that is gone and that started before the lock
was made, or when it was created while one of our trials ran and that trial is over: only those are
cleared. Anyone else's dead lock is reported with its path, for the user to remove. A lock that dies
while our builder waits on it is noticed within ``2 x REPORT_EVERY_S``: ours is cleared and the build goes
on; anyone else's stops the build with its path (never a wait until the timeout).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["needed_ops", "extensions_root", "ensure_ops", "dead_locks", "DeadLock", "clear_lock", "live_builds",
           "OpsError"]

OWNER_PREFIX = "autotune-builder"
"""``<op dir>/autotune-builder-<pid>.json``: one record per builder (``autotune-builder.json``: older ones)."""
MANIFEST_NAME = "autotune-ops.json"
CPU_ADAM, SHM_COMM = "cpu_adam", "deepspeed_shm_comm"
_BUILDERS = {CPU_ADAM: "CPUAdamBuilder", SHM_COMM: "ShareMemCommBuilder", "fused_adam": "FusedAdamBuilder"}


class OpsError(RuntimeError):
    """An op could not be built, or a dead lock that is not ours blocks it."""


def needed_ops(plans: Iterable, *, cpu: bool) -> list[str]:
    """The JIT-built ops trials of ``plans`` load: shm_comm on CPU, cpu_adam when a plan offloads the optimizer."""
    ops = [SHM_COMM] if cpu else []
    if any(getattr(p, "offload_optimizer", "none") != "none" for p in plans):
        ops.append(CPU_ADAM)
    return ops


def _torch_build_folder() -> str:
    """``py311_cpu`` etc., as torch's ``_get_build_directory`` names it, read without importing torch."""
    spec = importlib.util.find_spec("torch")
    text = ""
    if spec and spec.origin:
        with contextlib.suppress(OSError):
            text = (Path(spec.origin).parent / "version.py").read_text()

    def field(name: str) -> str | None:
        m = re.search(rf"^{name}(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        return m.group(1) if m else None

    hip, cuda = field("hip"), field("cuda")
    acc = f"rocm{hip.replace('.', '')}" if hip else f"cu{cuda.replace('.', '')}" if cuda else "cpu"
    return f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{acc}"


def extensions_root(env: dict | None = None) -> Path:
    """Where torch puts JIT-built extensions for a process with environment ``env`` (default: ours)."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.path.realpath(os.path.join(cache, "torch_extensions"))) / _torch_build_folder()


def _versions() -> str:
    out = []
    for pkg in ("deepspeed", "torch"):
        try:
            out.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{pkg} missing")
    return ", ".join(out)


def _built(root: Path, name: str) -> bool:
    return any((root / name).glob(f"{name}*.so"))


def _manifest(root: Path) -> dict:
    try:
        data = json.loads((root / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("versions") == _versions() else {}


# --------------------------------------------------------------------------------------------- locks


def _holders(lock: Path) -> list[int]:
    """Pids of processes holding ``lock`` open (torch's baton keeps its descriptor while building)."""
    target = str(lock.resolve()) if lock.exists() else str(lock)
    out = []
    for pid in psutil.pids():
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fd_dir}/{fd}") == target:
                        out.append(pid)
                        break
        except OSError:
            continue
    return out


def _process_gone(record: dict) -> bool:
    try:
        p = psutil.Process(int(record["pid"]))
        return abs(p.create_time() - float(record["start_time"])) > 0.05 or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class DeadLock:
    path: Path
    ours: bool
    why: str

    def describe(self) -> str:
        return f"DeepSpeed op build lock {self.path} has no live owner ({self.why})"


def dead_locks(root: Path, *, ours_since: float | None = None, ours_pids: Iterable[int] = ()) -> list[DeadLock]:
    """Build locks under ``root`` that no process holds. ``ours_since`` (epoch s) with ``ours_pids``
    gone: a lock created after that by one of our trials (whose processes are over) counts as ours."""
    out = []
    locks = list(root.glob("*/lock")) if root.is_dir() else []
    for lock in locks:
        if _holders(lock):
            continue
        try:
            created = lock.stat().st_mtime
        except OSError:
            continue  # released meanwhile
        gone = [r for r in _records(lock.parent) if r.get("host") == socket.gethostname() and _process_gone(r)
                and float(r.get("start_time", 1e18)) <= created + 1]
        if gone:
            out.append(DeadLock(lock, True, f"its builder, autotune's pid {gone[0].get('pid')}, is gone"))
        elif ours_since is not None and created >= ours_since - 1 and not any(psutil.pid_exists(p) for p in ours_pids):
            out.append(DeadLock(lock, True, "created by a trial of this study whose processes are gone"))
        else:
            out.append(DeadLock(lock, False, f"not created by autotune; if no build is running, remove it: rm {lock}"))
    return out


def _records(op_dir: Path) -> list[dict]:
    """Every builder record in an op's folder (a record that cannot be read is skipped)."""
    out = []
    for path in sorted(op_dir.glob(f"{OWNER_PREFIX}*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            if isinstance(record, dict):
                out.append(record)
    return out


def clear_lock(lock: DeadLock) -> None:
    """Remove a dead lock of ours (never anyone else's)."""
    if lock.ours:
        with contextlib.suppress(FileNotFoundError):
            lock.path.unlink()


def live_builds(root: Path, pids: Iterable[int]) -> list[str]:
    """Names of the ops being built right now by one of ``pids``."""
    pids = set(pids)
    locks = list(root.glob("*/lock")) if root.is_dir() else []
    return [lock.parent.name for lock in locks if pids & set(_holders(lock))]


# --------------------------------------------------------------------------------------------- building


def ensure_ops(names: list[str], *, env: dict | None = None, timeout_s: float = 1800.0,
               say: Callable[[str], None] = lambda s: None) -> dict[str, str]:
    """Build the ops ``names`` unless already built; returns ``{name: "built" | "cached" | "incompatible: ..."}``.

    Dead locks of ours are cleared first; a dead lock of someone else's, a build that fails, or
    one past ``timeout_s`` raises :class:`OpsError` naming it.
    """
    root = extensions_root(env)
    manifest = _manifest(root).get("ops", {})
    todo = [n for n in names if not _built(root, n) and not str(manifest.get(n, "")).startswith("incompatible")]
    state = {n: ("cached" if n not in todo else "") for n in names}
    for n in names:
        if n in manifest and str(manifest[n]).startswith("incompatible"):
            state[n] = manifest[n]
    locks = [lk for lk in dead_locks(root) if lk.path.parent.name in names]
    for lk in locks:
        if not lk.ours:
            raise OpsError(lk.describe())
        say(f"clearing {lk.describe()}")
        clear_lock(lk)
        if lk.path.parent.name not in todo:
            todo.append(lk.path.parent.name)  # the killed build may have left a half-written .so
    if not todo:
        return state
    t0 = time.monotonic()
    results = _run_builder(todo, env=env, timeout_s=timeout_s, say=say, root=root)
    say(f"built DeepSpeed's {_names(todo)} op{'s' if len(todo) > 1 else ''} in {_elapsed(time.monotonic() - t0)}")
    state.update(results)
    return state


REPORT_EVERY_S = 15.0
# Cold JIT builds measured on this project's 2-core machine: cpu_adam 59.5 s idle, shm_comm 320 s under other
# engineers' test runs. The range below is per op; a busier or smaller machine takes longer.
BUILD_MINUTES = (1, 6)


def _names(todo: list[str]) -> str:
    return " and ".join(n.removeprefix("deepspeed_") for n in todo)


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min {seconds % 60:02d} s"


def build_estimate(n_ops: int = 1) -> str:
    """An honest range for ``n_ops`` cold builds on this machine: cores and the current load average."""
    cores = os.cpu_count() or 1
    low, high = BUILD_MINUTES[0] * n_ops, BUILD_MINUTES[1] * n_ops
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    busy = f", longer under load (load average now {load:.1f} on {cores} cores)" if load >= cores * 0.75 else \
        ", longer under load"
    return f"about {low}-{high} minutes on {cores} core{'s' if cores > 1 else ''}{busy}"


def _builder_argv(todo: list[str]) -> list[str]:
    return [sys.executable, "-m", "autotune.tune.ops", *todo]


def _run_builder(todo: list[str], *, env: dict | None, timeout_s: float,
                 say: Callable[[str], None], root: Path | None = None) -> dict[str, str]:
    """Build ``todo`` in a child process, saying every ``REPORT_EVERY_S`` which op it is on and for how long, and
    watching the ops' locks (under ``root``): a lock nobody holds twice in a row is cleared when ours, else the
    build stops naming it."""
    import tempfile
    import threading

    what = f"DeepSpeed's {_names(todo)} op{'s' if len(todo) > 1 else ''}"
    say(f"building {what} once (first use on this machine; not counted in any trial's timeout): "
        f"{build_estimate(len(todo))}")
    t0 = time.monotonic()
    results: dict[str, str] = {}
    argv = _builder_argv(todo)
    dead_seen: set[Path] = set()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("OP "):
                    _, name, verdict = line.rstrip("\n").split(" ", 2)
                    results[name] = verdict

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while True:
            try:
                proc.wait(timeout=REPORT_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - t0
                if elapsed > timeout_s:
                    proc.kill()  # our own builder; its lock is recognised as ours and cleared next time
                    proc.wait()
                    raise OpsError(f"building {what} took over {_elapsed(timeout_s)}: stopped; the machine may be "
                                   f"overloaded, retry when it is quieter") from None
                dead = [lk for lk in dead_locks(root) if lk.path.parent.name in todo] if root is not None else []
                for lk in dead:
                    if lk.path not in dead_seen:
                        continue  # seen once: a holder may have closed it a moment ago; judge at the next look
                    if lk.ours:
                        say(f"clearing {lk.describe()}: the build waiting on it goes on")
                        clear_lock(lk)
                    else:
                        proc.kill()
                        proc.wait()
                        raise OpsError(f"building {what} waits on a lock nobody holds: {lk.describe()}") from None
                dead_seen = {lk.path for lk in dead}
                current = next((n for n in todo if n not in results), todo[-1])
                say(f"building DeepSpeed's {current.removeprefix('deepspeed_')} op once "
                    f"({len(results) + 1} of {len(todo)}): {build_estimate()}; elapsed {_elapsed(elapsed)}")
        reader.join(timeout=5)
        err.seek(0)
        stderr = err.read()
    if proc.returncode or set(results) != set(todo):
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise OpsError(f"building DeepSpeed ops {', '.join(todo)} failed (exit code {proc.returncode}): {last}")
    return results


def _build(names: list[str]) -> int:
    """Run in a subprocess: load (so JIT-build) each op, printing ``OP <name> built|incompatible: why``."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import _get_build_directory

    me = psutil.Process()
    verdicts = {}
    for name in names:
        builder = get_accelerator().create_op_builder(_BUILDERS.get(name, name))
        if builder is None or not deepspeed.ops.__compatible_ops__.get(name, False):
            verdicts[name] = f"incompatible: {get_accelerator()._name} accelerator has no compatible {name}"
        else:
            build_dir = Path(_get_build_directory(name, False))  # creates it
            record = build_dir / f"{OWNER_PREFIX}-{me.pid}.json"
            record.write_text(json.dumps({"pid": me.pid, "start_time": me.create_time(), "host": socket.gethostname(),
                                          "op": name}))
            builder.load(verbose=False)
            record.unlink(missing_ok=True)  # built: the record only matters while a build may die holding the lock
            verdicts[name] = "built"
        print(f"OP {name} {verdicts[name]}", flush=True)
    root = extensions_root()
    old = _manifest(root).get("ops", {})
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{MANIFEST_NAME}.{os.getpid()}"
        tmp.write_text(json.dumps({"versions": _versions(), "ops": {**old, **verdicts}}))
        os.replace(tmp, root / MANIFEST_NAME)
    return 0


if __name__ == "__main__":
    sys.exit(_build(sys.argv[1:]))
