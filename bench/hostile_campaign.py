"""Issue 21's campaign, measured: one list of hostile inputs run against two checkouts, counted by kind.

    python bench/hostile_campaign.py [--before REV] [--after REV] [--cases N] [--seed S] [--json PATH]
    python bench/hostile_campaign.py --only-current [--cases N]      # this checkout only, no worktrees
    python bench/hostile_campaign.py --write-case ID DIR [--cases N] [--seed S]   # one case's files and argv

Defaults: before 5e9061c (the code issue 21 was filed against), after HEAD, 2,300 cases, seed 21. Each rev gets a
``git worktree add --detach`` in a temporary folder (removed at the end, also on an error or Ctrl-C); nothing is
installed: a worker process per checkout (``--worker``: bench/campaign_worker.py) runs with ``PYTHONPATH=<worktree>`` (it says which ``autotune`` it
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

from campaign_cases import CASE, KINDS, Case, build_cases, classify, write_files  # noqa: E402
from campaign_worker import CASE_LIMIT_S, worker_main  # noqa: E402

REPO = BENCH.parent


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
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # bench/campaign_worker.py
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
