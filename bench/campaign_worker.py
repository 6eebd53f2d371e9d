"""The hostile campaign's worker (bench/hostile_campaign.py starts one per checkout as ``hostile_campaign.py --worker``
with ``PYTHONPATH=<checkout>``; this module is not a bench of its own: `make bench` runs it as a no-op):
it imports that checkout's ``autotune`` (the editable install's import hooks removed, ISOLATE), says which one and
sends the CLI's parser spec, then reads one case per line on stdin (JSON: folder, setup steps, argv, expectation)
and answers one line each: the case's exit code, captured output (Python's and the file descriptors'), the time,
and what went wrong (hang past the per-case limit, MemoryError under the address-space limit, an exception out of
``main``, ``tune`` reaching its study, the user's file lost by a killed ``emit --force``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from campaign_cases import CASE, TRACEBACK, parser_spec  # noqa: E402

CASE_LIMIT_S = 30.0
MEMORY_LIMIT = 4 * 2**30


class Hang(BaseException):
    """The case ran past its limit (a BaseException: product code's `except Exception` does not swallow it)."""


class StudyStarted(BaseException):
    """tune reached its study: every check passed."""


ISOLATE = r"""
import sys
# The repo's editable install maps autotune.templates / .schemas / .recipes to ITS checkout's folders: without
# it, the checkout under test reads its own (autotune.resources falls back to the folders next to the package).
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
                    and not type(f).__module__.startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in getattr(h, "__module__", "")]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
sys.path_importer_cache.clear()
"""


KILLED_EMIT = ISOLATE + r"""
import os, sys
from pathlib import Path
mode, out = sys.argv[1], Path(sys.argv[2])
def die_at(real):
    def call(src, dst, *a, **k):
        if Path(dst) == out:
            os._exit(9)
        return real(src, dst, *a, **k)
    return call
if mode.startswith("rename"):
    os.rename, os.replace = die_at(os.rename), die_at(os.replace)
    try:
        import autotune.bundle.writer as writer  # the exchange of the fixed code; absent before
    except ImportError:
        writer = None
    if writer is not None and hasattr(writer, "_renameat2"):
        if mode == "rename-noexchange":
            writer._renameat2 = lambda src, dst, flags: False
        else:
            writer._renameat2 = die_at(writer._renameat2)
from autotune.cli import main
sys.exit(main(["emit", "--recipe", "cpu-demo", "--out", str(out), "--force"]))
"""


def _trim(text: str) -> str:
    if len(text) <= 20000:
        return text
    kept = text[:2000] + "\n[...]\n" + text[-8000:]
    if TRACEBACK in text and TRACEBACK not in kept:
        kept += "\n" + text[text.rindex(TRACEBACK):][:4000]
    return kept


def _call(cli, argv: list[str], limit: float) -> dict:
    import contextlib
    import io
    import traceback

    cap = tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(cap.fileno(), 1)
    os.dup2(cap.fileno(), 2)
    out, err = io.StringIO(), io.StringIO()
    result: dict = {"status": "ok", "code": None}

    def alarm(signum, frame):  # noqa: ARG001
        raise Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    started = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                result["code"] = cli.main(argv)
            except SystemExit as exc:
                result["code"] = exc.code
    except Hang:
        result["status"], result["error"] = "hang", f"no answer within {limit:.0f} s"
    except StudyStarted:
        result["status"] = "study"
    except MemoryError:
        result["status"], result["error"] = "memory", "MemoryError under a 4 GiB address-space limit (unbounded read)"
    except BaseException:  # noqa: BLE001 - what escapes main is the finding
        result["status"], result["error"] = "exception", traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    result["secs"] = round(time.monotonic() - started, 3)
    if isinstance(result["code"], str):
        err.write(result["code"])
        result["code"] = 1
    cap.seek(0)
    fd_text = cap.read(200_000).decode("utf-8", "replace")
    cap.close()
    result["out"], result["err"] = _trim(out.getvalue()), _trim(err.getvalue() + fd_text)
    return result


def _pre(cli, step: list[str], folder: str, limit: float) -> None:
    if step[0] == "@symlink":
        os.symlink(step[1], step[2])
    elif step[0] == "@write":
        Path(step[1]).write_text(step[2])
    elif step[0] == "@age":  # what an emit left beside the folder, an hour old: the user comes back later
        for path in Path(folder).glob(step[1]):
            os.utime(path, (time.time() - 3600,) * 2, follow_symlinks=False)
    elif step[0] == "@killed-emit":
        mode, delay = step[1], float(step[2])
        proc = subprocess.Popen([sys.executable, "-c", KILLED_EMIT, mode, f"{folder}/job"], cwd=folder,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=delay if mode == "kill" else limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:
        _call(cli, step, limit)


def _user_file_kept(folder: str) -> bool:
    return any(p.is_file() and p.read_text(errors="replace") == "mine" for p in Path(folder).rglob("notes.txt"))


def worker_main() -> int:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    proto_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    proto_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # a case that reads stdin reads nothing, not the protocol
    os.dup2(devnull, 1)
    exec(ISOLATE, {})
    import autotune
    import autotune.cli as cli
    import autotune.tune.study
    from autotune import resources

    def no_study(*args, **kwargs):
        raise StudyStarted()

    autotune.tune.study.tune = no_study

    def send(doc):
        proto_out.write(json.dumps(doc) + "\n")
        proto_out.flush()

    data = [str(resources.package_dir(name)) for name in ("templates", "schemas", "recipes")]
    send({"hello": autotune.__file__, "data": data, "spec": parser_spec(cli.build_parser)})
    for line in proto_in:
        req = json.loads(line)
        folder = req["cwd"]
        os.chdir(folder)
        limit = req.get("limit", CASE_LIMIT_S)
        try:
            for step in req["pre"]:
                _pre(cli, [a.replace(CASE, folder) for a in step], folder, limit)
        except Exception:  # noqa: BLE001 - the case cannot be set up on this checkout
            import traceback

            send({"status": "setup", "error": traceback.format_exc()})
            continue
        os.chdir(folder)
        result = _call(cli, [a.replace(CASE, folder) for a in req["argv"]], limit)
        if req["expect"] == "dataloss" and not _user_file_kept(folder):
            result["lost"] = "the user's notes.txt ('mine') is nowhere under the case folder after the two emits"
        send(result)
    return 0
