#!/usr/bin/env python3
"""parse_tt_log.py LOGFILE -> JSON of torchtitan 0.3.0 per-step metrics.

Reads the metrics line torchtitan logs every metrics.log_freq steps:
  step: 3  loss:  7.92  grad_norm: 1.58  memory: 61.20GiB(43.80%)  tps: 1,934  tflops: 312.1  mfu: 31.6%
memory_gib is torchtitan's max *reserved* device memory since the previous log line.
"median" covers the logged steps after the first two (warm-up / compile / CUDA-graph capture).
"""
import json, re, statistics, sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE = re.compile(
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+\d.eE]+|nan|inf)\s+"
    r"(?:grad_norm:\s*(?P<grad_norm>[-+\d.eE]+|nan|inf)\s+)?"
    r"memory:\s*(?P<mem>[-+\d.]+)\s*GiB\((?P<mem_pct>[-+\d.]+)%\)\s+"
    r"tps:\s*(?P<tps>[\d,]+)\s+tflops:\s*(?P<tflops>[-\d,.]+)\s+mfu:\s*(?P<mfu>[-\d.]+%|N/A)")


def _f(x):
    return float(x.replace(",", ""))


def parse(path):
    steps = {}
    with open(path, errors="replace") as fh:
        for raw in fh:
            m = LINE.search(ANSI.sub("", raw))
            if not m:
                continue
            d = m.groupdict()
            steps[int(d["step"])] = {
                "step": int(d["step"]),
                "loss": _f(d["loss"]),
                "grad_norm": _f(d["grad_norm"]) if d["grad_norm"] else None,
                "memory_gib": _f(d["mem"]),
                "memory_pct": _f(d["mem_pct"]),
                "tps": _f(d["tps"]),
                "tflops": _f(d["tflops"]),
                "mfu": None if d["mfu"] == "N/A" else _f(d["mfu"].rstrip("%")),
            }
    rows = [steps[k] for k in sorted(steps)]
    tail = rows[2:]
    med = None
    if tail:
        med = {"n_steps": len(tail), "from_step": tail[0]["step"]}
        for k in ("loss", "memory_gib", "tps", "tflops", "mfu"):
            vals = [r[k] for r in tail if r[k] is not None]
            med[k] = statistics.median(vals) if vals else None
        med["memory_gib_max"] = max(r["memory_gib"] for r in tail)
    text = open(path, errors="replace").read()
    rc = re.findall(r"\[run_tt\] exit code (\d+)", text)
    return {"logfile": path, "n_logged_steps": len(rows), "steps": rows,
            "median_after_first_two": med,
            "exit_code": int(rc[-1]) if rc else None,
            "oom": bool(re.search(r"OutOfMemoryError|CUDA out of memory", text)),
            "training_completed": "Training completed" in text}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: parse_tt_log.py LOGFILE")
    print(json.dumps(parse(sys.argv[1]), indent=1))
