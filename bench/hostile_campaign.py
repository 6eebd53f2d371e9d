"""Issue 21's campaign, measured: one list of hostile inputs run against two checkouts, counted by kind.

    python bench/hostile_campaign.py [--before REV] [--after REV] [--cases N] [--seed S] [--json PATH]
    python bench/hostile_campaign.py --only-current [--cases N]      # this checkout only, no worktrees
    python bench/hostile_campaign.py --write-case ID DIR [--cases N] [--seed S]   # one case's files and argv

Defaults: before 5e9061c (the code issue 21 was filed against), after HEAD, 2,300 cases, seed 21. Each rev gets a
``git worktree add --detach`` in a temporary folder (removed at the end, also on an error or Ctrl-C); nothing is
installed: a worker process per checkout runs with ``PYTHONPATH=<worktree>`` (it says which ``autotune`` it
imported), and calls ``autotune.cli.main(argv)`` per case with stdout/stderr captured (Python's and the file
descriptors', so child processes' output counts too), a per-case limit (``signal.setitimer``, 30 s) and a 4 GiB
address-space limit (an unbounded read of /dev/zero ends in MemoryError, counted with the hangs). A worker that
does not answer within the limit + 30 s is killed with its process group and started again; so is one whose case
hung. ``tune`` never starts a study: ``autotune.tune.study.tune`` is replaced by a function that stops the case
(the case then "reached the study": clean for fuzz, nonsense accepted for an input that must be refused).

The cases (bench/campaign_cases.py, bench/campaign_targeted.py): the refusals issue 21 lists under "nonsense accepted" (with variants), the
correct real-world files it lists under "false alarms" (the after checkout's tests/fixtures/realworld for both
checkouts), special files (FIFOs, /dev/zero, long and looping paths), emit --force killed inside its swap (data
loss), and fuzz of every subcommand built from the after checkout's own argparse parser (tests/test_fuzz_cli.py's
generators, seeded with random.Random so both checkouts get the identical list). Kinds: traceback, hang, data
loss, nonsense accepted, false alarm, bad exit code (not 0/1/2), clean.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from campaign_cases import CASE, KINDS, TRACEBACK, Case, build_cases, classify, parser_spec, write_files  # noqa: E402

CASE_LIMIT_S = 30.0
MEMORY_LIMIT = 4 * 2**30
REPO = BENCH.parent


# ---- the worker: runs in the checkout under test ----------------------------------------------------------------

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


# ---- the parent: worktrees, workers, the table -------------------------------------------------------------------

class Worker:
    def __init__(self, checkout: Path, scratch: Path):
        self.checkout, self.scratch = checkout, scratch
        scratch.mkdir(parents=True, exist_ok=True)
        self.log = open(scratch / "worker.log", "ab")  # noqa: SIM115
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(self.checkout), PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONSTARTUP", None)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=self.scratch,
                                     start_new_session=True)
        self.buf = b""
        hello = self._read(180)
        if hello is None or not hello.get("hello"):
            raise RuntimeError(f"the worker for {self.checkout} did not start (see {self.scratch / 'worker.log'})")
        for where in [hello["hello"], *hello["data"]]:
            if not Path(where).resolve().is_relative_to(self.checkout.resolve()):
                raise RuntimeError(f"the worker for {self.checkout} reads autotune from {where}")
        self.spec = hello["spec"]

    def _read(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    return None
                self.buf += chunk
        finally:
            sel.close()
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()

    def close(self) -> None:
        self.stop()
        self.log.close()

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self._start()

    def run(self, case: Case, folder: Path, limit: float) -> dict:
        req = {"cwd": str(folder), "argv": case.argv, "pre": case.pre, "expect": case.expect, "limit": limit}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            wait = limit * (1 + len(case.pre)) + 30
            result = self._read(wait)
        except BrokenPipeError:
            result = None
        if result is None:
            time.sleep(0.2)
            died = self.proc.poll() is not None
            self.restart()
            return {"status": "died" if died else "hang",
                    "error": "the worker died" if died else f"the worker gave no answer within {wait:.0f} s"}
        if result["status"] in ("hang", "memory"):
            self.restart()  # a clean state for the next case
        return result


def run_campaign(cases: list[Case], checkout: Path, scratch: Path, *, limit: float = CASE_LIMIT_S,
                 label: str = "", progress=None) -> list[tuple[str, str, dict]]:
    """(kind, why, result) of each case, run by one worker with ``checkout`` on its PYTHONPATH."""
    scratch.mkdir(parents=True, exist_ok=True)
    worker = Worker(checkout, scratch)
    out = []
    started = time.monotonic()
    try:
        for i, case in enumerate(cases):
            folder = scratch / f"c{case.id}"
            write_files(case, folder)
            result = worker.run(case, folder, limit)
            kind, why = classify(case, result)
            out.append((kind, why, result))
            shutil.rmtree(folder, ignore_errors=True)
            if progress and (i + 1) % 100 == 0:
                progress(f"{label}: {i + 1}/{len(cases)} cases, {time.monotonic() - started:.0f} s")
    finally:
        worker.close()
    return out


def worker_spec(checkout: Path, scratch: Path) -> dict:
    worker = Worker(checkout, scratch)
    worker.close()
    return worker.spec


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def _short(arg: str) -> str:
    return arg if len(arg) <= 120 else f"{arg[:40]}...({len(arg)} chars)"


def _family(case: Case) -> str:
    return case.family.split(":")[0] if case.family.startswith("fuzz") else case.family


def _by_family(cases: list[Case], labels: list[str], results: dict[str, list]) -> str:
    """The cases that are not clean on some checkout, counted per family and kind."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for label in labels:
        for case, (kind, _, _) in zip(cases, results[label]):
            if kind != "clean":
                counts.setdefault((_family(case), kind), dict.fromkeys(labels, 0))[label] += 1
    if not counts:
        return ""
    width = max(len(f"{f} / {k}") for f, k in counts) + 2
    lines = [f"{'family / kind':<{width}}" + "".join(f"{label:>16}" for label in labels)]
    for (family, kind), row in sorted(counts.items(), key=lambda item: (KINDS.index(item[0][1]), item[0][0])):
        lines.append(f"{f'{family} / {kind}':<{width}}" + "".join(f"{row[label]:>16}" for label in labels))
    return "\n".join(lines)


def _table(labels: list[str], results: dict[str, list], n: int) -> str:
    width = max(len(k) for k in KINDS) + 2
    lines = [f"{'kind':<{width}}" + "".join(f"{label:>16}" for label in labels)]
    for kind in KINDS:
        lines.append(f"{kind:<{width}}" + "".join(f"{sum(1 for k, _, _ in results[label] if k == kind):>16}"
                                                   for label in labels))
    lines.append(f"{'cases':<{width}}" + "".join(f"{n:>16}" for _ in labels))
    return "\n".join(lines)


def _examples(cases: list[Case], rows: list, per_kind: int = 4) -> dict[str, list[dict]]:
    ex: dict[str, list[dict]] = {}
    for case, (kind, why, _) in zip(cases, rows):
        if kind == "clean":
            continue
        if len(ex.setdefault(kind, [])) < per_kind:
            ex[kind].append({"id": case.id, "family": case.family, "argv": [_short(a) for a in case.argv],
                             "why": why,
                             "shell": Case(0, "", [_short(a) for a in case.argv]).shell()})
    return ex


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="5e9061c")
    p.add_argument("--after", default="HEAD")
    p.add_argument("--cases", type=int, default=2300)
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--limit", type=float, default=CASE_LIMIT_S, help="seconds a case may take (default 30)")
    p.add_argument("--json", metavar="PATH", help="write the counts, the examples and every case's kinds here")
    p.add_argument("--only-current", action="store_true", help="this checkout only, no worktrees")
    p.add_argument("--no-processes", action="store_true", help="leave out the killed-emit (data loss) cases")
    p.add_argument("--write-case", nargs=2, metavar=("ID", "DIR"),
                   help="write case ID's files into DIR and print its command (this checkout's parser and fixtures)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main()
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731

    def interrupted(signum, frame):  # noqa: ARG001 - SIGTERM / SIGHUP as Ctrl-C: the worktrees are removed
        raise KeyboardInterrupt()

    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    tmp = Path(tempfile.mkdtemp(prefix="hostile-campaign-"))
    worktrees: list[Path] = []
    try:
        if args.only_current or args.write_case:
            checkouts = {"current": REPO}
        else:
            checkouts = {}
            for label, rev in (("before", args.before), ("after", args.after)):
                sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
                path = tmp / label
                _git("worktree", "add", "--detach", str(path), sha)
                worktrees.append(path)
                checkouts[f"{label} {sha[:7]}"] = path
        source = list(checkouts.values())[-1]  # the after checkout's parser, fixtures and recipe make the cases
        spec = worker_spec(source, tmp / "spec")
        cases = build_cases(args.cases, args.seed, spec, source / "tests" / "fixtures" / "realworld",
                            (source / "recipes" / "cpu-demo.yaml").read_text(), processes=not args.no_processes)
        if args.write_case:
            case = next(c for c in cases if c.id == int(args.write_case[0]))
            folder = Path(args.write_case[1]).resolve()
            write_files(case, folder)
            for step in case.pre:
                print("# first:", " ".join(a.replace(CASE, str(folder)) for a in step))
            print(case.shell(str(folder)))
            return 0
        say(f"hostile campaign: {len(cases)} cases (seed {args.seed}) against {', '.join(checkouts)}")
        results, times = {}, {}
        for label, path in checkouts.items():
            started = time.monotonic()
            results[label] = run_campaign(cases, path, tmp / "runs" / label.split()[0], limit=args.limit,
                                          label=label, progress=say)
            times[label] = round(time.monotonic() - started, 1)
        labels = list(checkouts)
        print(_table(labels, results, len(cases)))
        print("seconds" + " " * (max(len(k) for k in KINDS) - 5) + "".join(f"{times[label]:>16}" for label in labels))
        families = _by_family(cases, labels, results)
        if families:
            print("\n" + families)
        examples = {label: _examples(cases, results[label]) for label in labels}
        for label in labels:
            for kind, items in examples[label].items():
                print(f"\n{label}: {kind} (first {len(items)})")
                for item in items:
                    print(f"  #{item['id']} [{item['family']}] {item['shell']}\n      -> {item['why']}")
        print(f"\none case's files and command: python bench/hostile_campaign.py --cases {args.cases} --seed {args.seed} "
              "--write-case ID DIR")
        if args.json:
            doc = {"seed": args.seed, "cases": len(cases), "seconds": times,
                   "counts": {label: {kind: sum(1 for k, _, _ in results[label] if k == kind) for kind in KINDS}
                              for label in labels},
                   "examples": examples,
                   "per_case": [{"id": c.id, "family": c.family, "argv": [_short(a) for a in c.argv],
                                 **{label: {"kind": results[label][i][0], "why": results[label][i][1],
                                            "code": results[label][i][2].get("code"),
                                            "secs": results[label][i][2].get("secs")} for label in labels}}
                                for i, c in enumerate(cases)]}
            Path(args.json).write_text(json.dumps(doc, indent=1))
        return 0
    except KeyboardInterrupt:
        say("hostile campaign: interrupted; worktrees and workers removed")
        return 130
    finally:
        for path in worktrees:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], capture_output=True)
        if worktrees:
            subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
