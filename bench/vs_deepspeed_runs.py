"""The runs of bench/vs_deepspeed_autotuner.py: DeepSpeed's autotuner, ``autotune tune``, and the harness that
re-measures both picks (each in a process session of its own, ended whole on a timeout or Ctrl-C). The configs:
the user's (with DeepSpeed's ``autotuning`` block) and the user's with one pick. Not a bench of its own (`make bench`
runs it as a no-op); the flags, the table and the verdict are in vs_deepspeed_autotuner.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "workloads" / "ds_user_script.py"  # not bench/*.py: `make bench` runs those
MODEL = "tiny-gpt"  # what ds_user_script.py builds (autotune/presets/models/tiny-gpt.yaml)


class Failed(Exception):
    """A tool or a harness run did not give a result (exit 1)."""


def micro_batches(args) -> list[int]:
    per_rank = args.global_batch // args.ranks
    return [m for m in range(1, min(args.max_micro_batch, per_rank) + 1) if per_rank % m == 0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
    e.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def run(argv: list[str], log: Path, cwd: Path, timeout_s: float, extra_env: dict | None = None,
        stdout: Path | None = None) -> tuple[int, float]:
    """Run argv in a session of its own (ended whole on timeout or Ctrl-C); (exit code, wall seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as err, open(stdout or os.devnull, "w") as out:
        err.write(f"# {' '.join(argv)}\n")
        err.flush()
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=cwd, env={**env(), **(extra_env or {})}, stdout=out if stdout else err,
                                stderr=err, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except BaseException:
            with_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            with_group(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            with_group(proc.pid, signal.SIGKILL)  # a rank its launcher left behind
    return rc, time.monotonic() - start


def with_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def user_config(args) -> dict:
    """The user's DeepSpeed config, as given to DeepSpeed's autotuner (lists: the values it searches)."""
    mbs = micro_batches(args)
    auto = {"enabled": True, "fast": True, "metric": "throughput", "start_profile_step": 3, "end_profile_step": 5,
            "max_train_micro_batch_size_per_gpu": mbs[-1]}  # its defaults, written out (autotuning/constants.py)
    cfg = {"train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": 1}
    if args.ds_micro_batches == "auto":
        auto["max_train_batch_size"] = args.global_batch
        cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    return {**cfg, "zero_optimization": {"stage": list(args.zero)}, "bf16": {"enabled": True},
            # torch's AdamW, as autotune's trials use: neither side JIT-builds DeepSpeed's CPU Adam
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.1, "torch_adam": True}},
            "gradient_clipping": 1.0, "steps_per_print": 1_000_000, "autotuning": auto}


def common_config(args, stage: int, mbs: int, gas: int) -> dict:
    """The user's config with one pick: what DeepSpeed's fast mode runs for it (autotuner.py
    run_tuning_micro_batch_sizes: the first value of each list, zero_optimization = {stage})."""
    cfg = {k: v for k, v in user_config(args).items() if k != "autotuning"}
    return {**cfg, "train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": gas,
            "train_batch_size": mbs * gas * args.ranks, "zero_optimization": {"stage": stage}}


def run_deepspeed(args, out: Path) -> dict:
    work = out / "deepspeed"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "ds_config.json").write_text(json.dumps(user_config(args), indent=2))
    argv = ["deepspeed", "--autotuning", args.ds_mode, "--num_gpus", str(args.ranks), "--master_port",
            str(free_port()), str(SCRIPT), "--seq-len", str(args.seq_len), "--deepspeed_config", "ds_config.json"]
    log = work / "autotuner.log"
    print(f"[1/3] DeepSpeed's autotuner: {' '.join(argv)} (log: {log})", flush=True)
    rc, wall = run(argv, log, work, args.phase_timeout_min * 60, {"LOCAL_SIZE": str(args.ranks)})
    results = work / "autotuning_results"
    optimal = results / "ds_config_optimal.json"
    if not optimal.is_file():
        raise Failed(f"DeepSpeed's autotuner (exit code {rc}) wrote no {optimal}; see {log} and the "
                     f"stderr.log files under {results}")
    pick = json.loads(optimal.read_text())
    exps, best = [], None
    for d in sorted(p for p in results.iterdir() if (p / "exp.json").is_file()):
        m = json.loads((d / "metrics.json").read_text()) if (d / "metrics.json").is_file() else None
        exps.append({"name": d.name, "latency": m and m.get("latency"), "throughput": m and m.get("throughput")})
    summary = (results / "summary.txt").read_text() if (results / "summary.txt").is_file() else ""
    for e in exps:
        if e["throughput"] and (best is None or e["throughput"] > best["throughput"]):
            best = e
    profile = sum(e["name"] == "profile_model_info" for e in exps)
    return {"wall_s": wall, "exit_code": rc, "experiments": len(exps) - profile, "profile_runs": profile,
            "summary": summary.strip(), "pick": {"zero": pick.get("zero_optimization", {}).get("stage", 0),
                                                "mbs": pick["train_micro_batch_size_per_gpu"],
                                                "gas": pick.get("gradient_accumulation_steps", 1)},
            "own_config": str(optimal), "experiments_detail": exps,
            "own": {"name": best and best["name"], "latency": best and best["latency"],
                    "throughput_samples_per_s": best and best["throughput"],
                    "tokens_per_s": best and best["throughput"] * args.seq_len}}


def run_autotune(args, out: Path) -> dict:
    work = out / "autotune"
    shutil.rmtree(work, ignore_errors=True)
    argv = [sys.executable, "-m", "autotune", "tune", "--model", MODEL, "--gpu", "cpu", "--num-gpus",
            str(args.ranks), "--seq-len", str(args.seq_len), "--global-batch", str(args.global_batch),
            "--tp", "1", "--pp", "1", "--cp", "1", "--zero", ",".join(map(str, args.zero)), "--max-micro-batch",
            str(args.max_micro_batch), "--recompute", "none", "--no-offload", "--engine", "deepspeed",
            "--workload", "script", "--script", str(SCRIPT), "--trials", str(args.trials), "--top-k",
            str(args.top_k), "--finalists", str(args.finalists), "--finalist-runs", str(args.finalist_runs),
            "--out", str(work), "--json", "--", "--seq-len", str(args.seq_len)]
    log, answer = out / "autotune_tune.log", out / "autotune_tune.json"
    print(f"[2/3] autotune: {' '.join(argv)} (log: {log})", flush=True)
    rc, wall = run(argv, log, REPO, args.phase_timeout_min * 60, stdout=answer)
    try:
        doc = json.loads(answer.read_text())
    except ValueError:
        doc = {}
    if rc != 0 or not doc.get("best"):
        raise Failed(f"autotune tune exit code {rc}: {doc.get('reason') or 'no result'}; see {log}")
    plan = doc["best"]["plan"]
    reruns = sum(len(f["rerun_tokens_per_s"]) for f in doc.get("finalists", []))
    return {"wall_s": wall, "exit_code": rc, "trials": sum(doc["states"].values()), "states": doc["states"],
            "reruns": reruns, "experiments": sum(doc["states"].values()) + reruns,
            "pick": {"zero": plan["zero_stage"], "mbs": plan["micro_batch_size"], "gas": plan["grad_accum_steps"]},
            "own_config": str(work / "winner" / "ds_config.json"),
            "own": {"tokens_per_s": doc["best"]["measurement"]["tokens_per_s"],
                    "finalist_median": next((f["median"] for f in doc.get("finalists", [])
                                             if f["trial"] == doc["best"]["trial"]), None)}}


def harness_config(args, tool: dict) -> dict:
    if args.remeasure_config == "own":
        cfg = json.loads(Path(tool["own_config"]).read_text())
        cfg.pop("autotuning", None)
        return cfg
    return common_config(args, tool["pick"]["zero"], tool["pick"]["mbs"], tool["pick"]["gas"])


def remeasure(args, out: Path, name: str, tool: dict, i: int) -> dict:
    work = out / "remeasure"
    cfg = harness_config(args, tool)
    path = work / f"{name}_ds_config.json"
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2))
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks), "--master_addr",
            "127.0.0.1", "--master_port", str(free_port()), str(SCRIPT), "--seq-len", str(args.seq_len),
            "--max-steps", str(args.warmup_steps + args.steps), "--deepspeed_config", str(path)]
    log = work / f"{name}_{i}.log"
    rc, wall = run(argv, log, REPO, 600)
    times = {}
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "STEP_TIME":
            times[int(parts[1])] = float(parts[2])
    measured = [t for s, t in sorted(times.items()) if s > args.warmup_steps]
    if len(measured) < args.steps:
        raise Failed(f"harness run {name} #{i} (exit code {rc}) printed {len(measured)} of {args.steps} measured "
                     f"STEP_TIME lines; see {log}")
    batch = cfg["train_micro_batch_size_per_gpu"] * cfg.get("gradient_accumulation_steps", 1) * args.ranks
    step = statistics.median(measured)
    return {"tool": name, "run": i, "step_s": step, "tokens_per_s": batch * args.seq_len / step, "wall_s": wall,
            "log": str(log)}
