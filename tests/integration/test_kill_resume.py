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


def run(bundle: Path, engine: str, train_args: str, *, kill_on_hold: bool = False, script: str | None = None) -> dict:
    """Start the bundle's launch script (or ``script``); the LOSS / CHECKPOINT / RESUMED / RESULT lines of rank 0,
    parsed."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(pick_free_port()), AUTOTUNE_TRAIN_ARGS=train_args)
    err = (bundle / "stderr.txt").open("a")
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", str(bundle / (script or SCRIPT[engine]))], stdout=subprocess.PIPE, stderr=err, text=True,
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


@pytest.mark.parametrize("engine,layout", [("deepspeed", ()), ("fsdp", ()), ("deepspeed", ("--pp", "2")),
                                           ("fsdp", ("--pp", "2"))],
                         ids=["deepspeed", "fsdp", "deepspeed-pp2", "fsdp-pp2"])
def test_killed_run_resumes_the_same_curve(engine, layout, tmp_path):
    """(pp2: DeepSpeed's PipelineModule, or torch pipelining of FSDP2 stages, on 2 stages, each saving its own
    layers.)"""
    whole = run(_emit(tmp_path, "whole", engine, 2, "--global-batch", "4", "--save-interval", "100", *layout), engine,
                _args(engine))
    bundle = _emit(tmp_path, "killed", engine, 2, "--global-batch", "4", "--save-interval", "2", "--keep-last", "2",
                   *layout)
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


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp"])
def test_reshard_4_to_2(engine, tmp_path):
    """A 4-rank run saves at step 4 and goes on to step 6; a 2-rank bundle resumes the step-4 checkpoint.

    Both plans use micro-batch 2 without accumulation (global batch 8 on 4 ranks, 4 on 2), so rank 0 draws the
    same stream-0 batches in both: step 5's loss on rank 0 is a forward pass of the restored weights on the batch
    the 4-rank run used at step 5, and must equal it (DCP's reshard and DeepSpeed's universal checkpoint restore
    the fp32 master weights exactly; bf16 compute of equal weights on equal tokens, one thread per rank). Step 6
    follows an update from half as many sequences, so its loss only continues the curve: within 0.02 of the
    4-rank run's, where the spread of the 4-rank run's own step losses is about 0.05 (random tokens, loss near
    ln 512 = 6.24); the learning rate of both steps is the schedule's."""
    ckpt = tmp_path / "ckpt"
    four = _emit(tmp_path, "four", engine, 4, "--global-batch", "8", "--save-interval", "4", "--save-dir", str(ckpt))
    big = run(four, engine, _args(engine).replace(f"--steps {STEPS - 1}", "--steps 5"))
    assert [c["step"] for c in big["checkpoints"]] == [4] and sorted(big["steps"]) == list(range(1, 7))
    two = _emit(tmp_path, "two", engine, 2, "--global-batch", "4", "--save-interval", "100", "--save-dir", str(ckpt))
    if engine == "deepspeed":
        tag = (ckpt / "latest").read_text().strip()
        conv = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                               str(ckpt / tag), "--output_folder", str(ckpt / f"{tag}_universal")],
                              capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert conv.returncode == 0, conv.stdout[-2000:] + conv.stderr[-3000:]
        cfg_path = two / "ds_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["checkpoint"]["load_universal"] = True  # as the DeepSpeed resume note and resume_fallback.sh say
        cfg_path.write_text(json.dumps(cfg, indent=2))
    small = run(two, engine, _args(engine).replace(f"--steps {STEPS - 1}", "--steps 5"))
    print(f"\n{engine} 4 -> 2 ranks: 4-rank run {big['wall_s']} s, 2-rank resume {small['wall_s']} s")
    for step in (5, 6):
        print(f"  step {step}: 4 ranks {big['steps'][step]}  2 ranks after reshard {small['steps'][step]}  "
              f"diff {small['steps'][step][0] - big['steps'][step][0]:+.3g}")
    assert small["resumed"]["step"] == 4 and sorted(small["steps"]) == [5, 6]
    if engine == "deepspeed":
        assert small["resumed"]["universal"] is True and "_universal/" in small["resumed"]["path"]
    assert [small["steps"][s][1] for s in (5, 6)] == [big["steps"][s][1] for s in (5, 6)]
    assert small["steps"][5][0] == pytest.approx(big["steps"][5][0], abs=1e-5)
    assert small["steps"][6][0] == pytest.approx(big["steps"][6][0], abs=0.02)


def test_async_save_blocks_less(tmp_path):
    """FSDP2 on 2 ranks, the tiny-llama preset cut to 2 layers (2.0 M parameters, 24 MB of fp32 weights and Adam
    moments per save), 4 saves each: dcp.async_save returns after staging a copy in host memory and writes in a
    background thread, dcp.save returns once written. Blocked: the save call; total: until the checkpoint is
    complete (DCP's metadata written, the marker after it)."""
    from autotune.resources import data_path

    model = yaml.safe_load(data_path("presets", "models/tiny-llama.yaml").read_text())
    model["num_layers"] = 2
    out = {}
    for name, flags in (("async", ()), ("sync", ("--no-async-save",))):
        bundle = _emit(tmp_path, name, "fsdp", 2, "--global-batch", "4", "--save-interval", "2", "--keep-last", "1",
                       *flags, model=model)
        saves = run(bundle, "fsdp", _args("fsdp"))["checkpoints"]
        assert [c["step"] for c in saves] == [2, 4, 6, 8] and {c["async"] for c in saves} == {name == "async"}
        out[name] = saves
    med = {}
    for name, saves in out.items():
        for field in ("blocked_s", "total_s"):
            values = sorted(c[field] for c in saves)
            med[f"{name} {field}"] = (values[1] + values[2]) / 2
    print("\nFSDP2 save, median of 4 (s): " + ", ".join(f"{k} {v:.4f}" for k, v in med.items()))
    print("  per save: " + "; ".join(f"{n}: " + ", ".join(f"{c['blocked_s']:.3f}/{c['total_s']:.3f}" for c in v)
                                       for n, v in out.items()))
    assert med["async blocked_s"] < med["sync blocked_s"]
    assert med["async blocked_s"] < med["async total_s"]


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp"])
def test_the_bundles_fallback_resumes_the_checkpoint_on_fewer_ranks(engine, tmp_path):
    """The bundle as emitted for 4 ranks, with the fallback for losing 2 of them: resume_fallback.sh runs the
    conversion the format needs (DeepSpeed: ds_to_universal; DCP: none) and the fallback's own launcher, which
    resumes the 4-rank run's step-4 checkpoint on 2 ranks with the same global batch (micro-batches accumulated)."""
    bundle = _emit(tmp_path, "job", engine, 4, "--global-batch", "8", "--save-interval", "4", "--lost-gpus", "2")
    fallback = json.loads((bundle / "fallback" / "plan.json").read_text())["plan"]
    assert (fallback["dp"] * fallback["tp"] * fallback["pp"], fallback["global_batch_size"]) == (2, 8)
    big = run(bundle, engine, _args(engine).replace(f"--steps {STEPS - 1}", "--steps 5"))
    assert [c["step"] for c in big["checkpoints"]] == [4]
    small = run(bundle, engine, _args(engine).replace(f"--steps {STEPS - 1}", "--steps 5"), script="resume_fallback.sh")
    print(f"\n{engine} fallback 4 -> 2 ranks: {big['wall_s']} s, then {small['wall_s']} s; step 5 "
          f"{big['steps'][5]} vs {small['steps'][5]}")
    assert small["resumed"]["step"] == 4 and sorted(small["steps"]) == [5, 6]
    if engine == "deepspeed":
        assert small["resumed"]["universal"] is True
    assert [small["steps"][s][1] for s in (5, 6)] == [big["steps"][s][1] for s in (5, 6)]  # the schedule goes on
    # Step 5 is the restored weights on the same 8 sequences, split into other micro-batches: close, not equal.
    assert small["steps"][5][0] == pytest.approx(big["steps"][5][0], abs=0.02)
