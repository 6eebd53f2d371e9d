"""Kill and resume the built-in trainers as emitted bundles run them (issue 19, items 5-6): real DeepSpeed 0.19.8,
real torch DCP, real launchers and processes, 2 (or 4) CPU gloo ranks.

The checkpoint policy comes from the bundle (``autotune emit --save-interval 2 --keep-last 2``: the ``checkpoint``
block of plan.json); the run length, the FSDP2 learning-rate schedule and the hold point go through
``AUTOTUNE_TRAIN_ARGS``, which the trainer appends to its command line, so every run starts the bundle's own
launch script unchanged. ``--hold-after-step 5`` makes the ranks wait, once step 5 (and the save of step 4 before
it) is done, so that the SIGKILL of every process of the launch lands between two saves every time, not by luck.

- (a) + (b) ``test_killed_run_resumes_the_same_curve``: an uninterrupted 8-step run records per-step loss and
  learning rate; a second bundle's run saves at steps 2 and 4, is SIGKILLed after step 5 (launcher, its process
  group and every worker, which torchrun starts in sessions of their own), and is relaunched with the same
  script: it resumes from step 4 and steps 5-8 have the uninterrupted run's loss and learning rate, bit for bit.
- (c) ``test_reshard_4_to_2``: a 4-rank run saves at step 4; a 2-rank bundle resumes from that checkpoint (FSDP2:
  DCP reshards on load; DeepSpeed: ``ds_to_universal`` then ``checkpoint.load_universal: true``).
- (d) ``test_async_save_blocks_less``: FSDP2's ``dcp.async_save`` against ``dcp.save``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import pick_free_port  # tests/ is on sys.path (no __init__)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("deepspeed_ops")]

SCRIPT = {"deepspeed": "launch_deepspeed.sh", "fsdp": "launch_torchrun.sh"}
STEPS = 8  # 1 warm-up + 7
# The same schedule for both: peak 1e-2 after a 3-step linear warm-up, cosine to 20 steps (LR differs every step).
DS_LR = ("--lr", "1e-2", "--warmup-steps", "3", "--train-steps", "20")
FSDP_LR = "--lr 1e-2 --lr-warmup-steps 3 --lr-decay-steps 20"
TINY = {"name": "tiny-ckpt", "source": "test model: 2 layers x 64 wide", "num_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 176, "vocab_size": 512,
        "activation": "swiglu", "norm": "rmsnorm", "tied_embeddings": False, "position_embedding": "rope",
        "max_position_embeddings": 2048}


def _emit(tmp: Path, name: str, engine: str, gpus: int, *flags: str, model: dict | None = None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    spec = tmp / f"{name}-model.yaml"
    spec.write_text(yaml.safe_dump(model or TINY))
    out = tmp / name
    zero = ("--zero", "1") if engine == "deepspeed" else ("--zero", "3")
    cmd = [sys.executable, "-m", "autotune", "emit", "--model", str(spec), "--gpu", "cpu", "--num-gpus", str(gpus),
           "--gpus-per-node", str(gpus), "--seq-len", "64", "--recompute", "none", "--engine", engine, *zero,
           "--micro-batch", "2", "--out", str(out), *(DS_LR if engine == "deepspeed" else ()), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group and every process under it (torchrun's workers run in their own
    sessions, so the group alone would leave them running): as a lost node ends them."""
    pids = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(bundle: Path, engine: str, train_args: str, *, kill_on_hold: bool = False) -> dict:
    """Start the bundle's launch script; the LOSS / CHECKPOINT / RESUMED / RESULT lines of rank 0, parsed."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(pick_free_port()), AUTOTUNE_TRAIN_ARGS=train_args)
    err = (bundle / "stderr.txt").open("a")
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", str(bundle / SCRIPT[engine])], stdout=subprocess.PIPE, stderr=err, text=True,
                            env=env, cwd=bundle.parent, start_new_session=True)
    out: dict = {"steps": {}, "checkpoints": [], "resumed": None, "result": None, "held": False, "lines": []}
    try:
        for line in proc.stdout:
            out["lines"].append(line.rstrip())
            kind, _, rest = line.partition(" ")
            if kind == "LOSS":
                step, loss, lr = rest.split()
                out["steps"][int(step)] = (float(loss), None if lr == "None" else float(lr))
            elif kind == "CHECKPOINT":
                out["checkpoints"].append(json.loads(rest))
            elif kind == "RESUMED":
                out["resumed"] = json.loads(rest)
            elif kind == "RESULT":
                out["result"] = json.loads(rest)
            elif kind == "HOLD" and kill_on_hold:
                out["held"] = True
                _kill_all(proc)
            if time.monotonic() - t0 > 400:
                _kill_all(proc)
                raise AssertionError("run took over 400 s")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            _kill_all(proc)
        err.close()
    out["rc"], out["wall_s"] = proc.returncode, round(time.monotonic() - t0, 1)
    if not kill_on_hold:
        assert proc.returncode == 0 and out["result"], (f"exit {proc.returncode}\n" + "\n".join(out["lines"][-30:])
                                                        + (bundle / "stderr.txt").read_text()[-4000:])
    return out


def _args(engine: str, *more: str) -> str:
    return " ".join([f"--steps {STEPS - 1}", *([FSDP_LR] if engine == "fsdp" else []), *more])


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp"])
def test_killed_run_resumes_the_same_curve(engine, tmp_path):
    whole = run(_emit(tmp_path, "whole", engine, 2, "--global-batch", "4", "--save-interval", "100"), engine,
                _args(engine))
    bundle = _emit(tmp_path, "killed", engine, 2, "--global-batch", "4", "--save-interval", "2", "--keep-last", "2")
    killed = run(bundle, engine, _args(engine, "--hold-after-step 5"), kill_on_hold=True)
    resumed = run(bundle, engine, _args(engine))
    print(f"\n{engine}: uninterrupted {whole['wall_s']} s, killed {killed['wall_s']} s, resumed {resumed['wall_s']} s")
    for step in range(1, STEPS + 1):
        print(f"  step {step}: uninterrupted {whole['steps'][step]}  killed {killed['steps'].get(step)}  "
              f"resumed {resumed['steps'].get(step)}")

    assert whole["result"]["first_step"] == 0 and sorted(whole["steps"]) == list(range(1, STEPS + 1))
    lrs = [whole["steps"][s][1] for s in range(1, STEPS + 1)]
    assert len(set(lrs[1:])) == STEPS - 1, lrs  # the schedule moves at every step: a reset LR would show
    # The kill landed after the save of step 4 and before that of step 6; nothing after step 5 ran.
    assert killed["held"] and killed["result"] is None and killed["rc"] != 0
    assert [c["step"] for c in killed["checkpoints"]] == [2, 4] and max(killed["steps"]) == 5
    assert resumed["resumed"]["step"] == 4 and resumed["result"]["first_step"] == 4
    assert sorted(resumed["steps"]) == list(range(5, STEPS + 1))
    # Steps 1-4 come from the killed run's checkpoint, 5-8 from the resumed run: together the uninterrupted
    # curve, loss and learning rate exact (deterministic CPU kernels, one thread per rank, same batches).
    for step in range(1, STEPS + 1):
        got = killed["steps"][step] if step <= 4 else resumed["steps"][step]
        assert got == whole["steps"][step], (step, got, whole["steps"][step])
    # keep_last 2: the resumed run's saves at 6 and 8 leave the newest two.
    names = sorted(n for n in os.listdir(bundle / "checkpoints") if (bundle / "checkpoints" / n).is_dir())
    assert names == (["global_step6", "global_step8"] if engine == "deepspeed" else ["step-6", "step-8"]), names
