"""`autotune tune` measuring plans of other engines and dimensions: FSDP2 and DeepSpeed-Ulysses, for real.

tiny-llama on 2 gloo ranks, seq 64, global batch 8, trials cut to few layers and 2 measured steps, no
pruning and no finalist re-runs (each trial measured once), so the study stays short:

- FSDP2 (``--engine fsdp``, full shard, no offload, micro-batch 4, 2 layers): exactly three feasible
  plans, all measured, no DeepSpeed op built first (FSDP trials run no DeepSpeed): full shard over dp 2, FSDP2 + DTensor TP (tp 2), ``torch.distributed.pipelining``
  1F1B (pp 2; the interleaved plans deeper than the 2 layers + the embedding + the output, pp 2 x vpp 3 and up,
  are reported as not measured);
- HSDP (4 ranks, ``dp_replicate`` searched): full shard over dp 4 and hybrid 2 x 2, both measured, each
  trainer's device mesh checked;
- DeepSpeed-Ulysses (cp 2, ZeRO-1): the first trial's rank 1 fails on purpose (a ``sitecustomize``
  on PYTHONPATH raises in the trainer's main once), the next one is measured; the failed trial's reason
  is that rank's exception, not torchrun's banner;
- Megatron plans: refused before any trial (their pretrain_gpt.py needs CUDA), pointing at --workload command.

Each winner's files are read back by their own loaders: plan.json by ``python -m autotune.train``'s loader,
the engine's config by ``autotune validate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

pytestmark = pytest.mark.slow  # runs `autotune tune` (torchrun trials) in subprocesses
REPO = Path(__file__).resolve().parents[2]
BASE = ["--model", "tiny-llama", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--global-batch", "8",
        "--no-offload", "--recompute", "none", "--steps", "2", "--warmup-steps", "1", "--prune-ratio", "0",
        "--finalists", "0", "--trial-timeout", "240", "--json"]

FAIL_ONCE = textwrap.dedent('''
    """Test-only: rank 1 of the first trial that imports autotune.train.deepspeed raises in its main()."""
    import importlib.abc
    import importlib.machinery
    import os
    import sys

    MARK = os.environ.get("AUTOTUNE_TEST_FAIL_ONCE")


    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "autotune.train.deepspeed":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                real = module.main

                def main(*args, **kwargs):
                    try:
                        os.close(os.open(MARK, os.O_CREAT | os.O_EXCL))
                    except FileExistsError:
                        return real(*args, **kwargs)
                    raise RuntimeError("injected failure on rank 1 (test)")

                module.main = main

            spec.loader.exec_module = exec_module
            return spec


    if MARK and os.environ.get("RANK") == "1":
        sys.meta_path.insert(0, _Hook())
''')


def _env(extra_path: Path | None = None, **extra) -> dict:
    env = dict(os.environ)
    paths = [str(REPO)] + ([str(extra_path)] if extra_path else []) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                       else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _tune(out: Path, *args: str, env: dict | None = None) -> tuple[dict, subprocess.CompletedProcess]:
    done = subprocess.run([sys.executable, "-m", "autotune", "tune", *BASE, *args, "--out", str(out)], cwd=REPO,
                          env=env or _env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout), done


def _trials(out: Path):
    return optuna.load_study(study_name="autotune", storage=f"sqlite:///{out / 'study.db'}").get_trials()


def _check_measured(t, engine: str) -> None:
    plan = t.user_attrs["plan"]
    assert t.params["engine"] == engine
    for dim in ("tp", "pp", "cp", "vpp", "micro_batch_size", "zero_stage", "precision", "recompute"):
        assert t.params[dim] == plan[dim], (dim, t.params, plan)  # the trial's plan dims are Optuna params
    m = t.user_attrs["measurement"]
    assert t.value == m["tokens_per_s"] > 0
    assert m["step_time_s"] > 0 and len(m["step_times_s"]) == 2
    assert m["peak_memory_bytes"] > 50 * 2**20  # a rank's peak RSS: python + torch alone exceed it
    assert (Path(t.user_attrs["log_path"]).parent / "result.json").is_file()


def _check_winner(doc: dict, out: Path, config_files: list[str]) -> dict:
    """The winner's bundle: its plan.json loads as the trainer loads it, its files pass `autotune validate`."""
    from autotune.train.__main__ import load_estimate

    winner = Path(doc["winner_dir"])
    assert winner == out / "winner"
    job = load_estimate(str(winner / "plan.json"))
    assert job.plan.to_dict() == doc["best"]["plan"]
    files = [winner / name for name in config_files]
    for f in files + [winner / "launch_torchrun.sh", winner / "plan.md"]:
        assert f.is_file(), f
    assert subprocess.run(["bash", "-n", str(winner / "launch_torchrun.sh")]).returncode == 0
    checked = subprocess.run([sys.executable, "-m", "autotune", "validate", *map(str, files), str(winner / "plan.json")],
                             cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Measured" in (winner / "plan.md").read_text()
    return doc["best"]["plan"]


def test_fsdp_study_measures_full_shard_tp_and_pipelining(tmp_path):
    out, ext = tmp_path / "fsdp", tmp_path / "torch_extensions"
    # a fresh extensions folder: FSDP trials run no DeepSpeed, so the study builds no DeepSpeed op first
    doc, done = _tune(out, "--engine", "fsdp", "--zero", "3", "--micro-batch", "4", "--cp", "1", "--num-layers", "2",
                      "--trials", "3", "--top-k", "3", env=_env(TORCH_EXTENSIONS_DIR=str(ext)))
    assert "building DeepSpeed ops" not in done.stderr and not ext.exists()
    trials = _trials(out)
    assert all(t.state == TrialState.COMPLETE for t in trials), [(t.params, t.user_attrs.get("reason")) for t in trials]
    layouts = {(t.params["tp"], t.params["pp"], t.user_attrs["plan"]["dp"]): t for t in trials}
    assert set(layouts) == {(1, 1, 2), (2, 1, 1), (1, 2, 1)}, layouts.keys()
    for t in trials:
        _check_measured(t, "fsdp")
        assert t.params["zero_stage"] == 3
    assert doc["states"] == {"complete": 3}
    # pp 2 x vpp 3 and deeper need more than 2 layers (the embedding and the output a stage's layer each, as
    # torchtitan splits): never launched, and the output says why
    assert "--num-layers 2 leaves fewer layers" in doc["not_measured"]
    assert "not measured (never launched)" in done.stderr
    # the cpu cluster's winner has no accelerate FSDP2 config (accelerate 1.16 runs FSDP on GPUs only); its
    # plan.md says why
    plan = _check_winner(doc, out, [])
    assert plan["engine"] == "fsdp"
    assert not (out / "winner" / "accelerate_fsdp.yaml").exists()
    assert "accelerate_fsdp.yaml is not written: accelerate 1.16.0 runs FSDP on GPUs" in \
        (out / "winner" / "plan.md").read_text()
    assert (out / "cal.json").is_file()


def test_hsdp_study_measures_hybrid_and_full_shard_on_four_ranks(tmp_path):
    """dp_replicate is searched: on 4 ranks (the cpu preset's nodes of 2) full shard over 4 and HSDP 2 x 2."""
    out = tmp_path / "hsdp"
    doc, _ = _tune(out, "--num-gpus", "4", "--engine", "fsdp", "--zero", "3", "--micro-batch", "2", "--tp", "1",
                   "--pp", "1", "--cp", "1", "--num-layers", "1", "--trials", "2", "--top-k", "2")
    trials = _trials(out)
    assert all(t.state == TrialState.COMPLETE for t in trials), [(t.params, t.user_attrs.get("reason")) for t in trials]
    by_replicas = {t.params["dp_replicate"]: t for t in trials}
    assert set(by_replicas) == {1, 2}
    for replicas, t in by_replicas.items():
        _check_measured(t, "fsdp")
        assert t.user_attrs["plan"]["dp_replicate"] == replicas
        result = next(line for line in Path(t.user_attrs["log_path"]).read_text().splitlines()
                      if line.startswith("RESULT "))
        mesh = json.loads(result[len("RESULT "):])["mesh"]  # the mesh FSDP2 was applied on
        assert (mesh["dp_replicate"], mesh["dp_shard"]) == ((2, 2) if replicas == 2 else (1, 4)), mesh
    from autotune.train.__main__ import load_estimate

    winner = out / "winner"
    assert load_estimate(str(winner / "plan.json")).plan.to_dict() == doc["best"]["plan"]
    # the cpu preset's 4 ranks are 2 nodes of 2: validate accepts the winner's files for 4 ranks
    checked = subprocess.run([sys.executable, "-m", "autotune", "validate", str(winner / "plan.json"),
                              str(winner / "hostfile")], cwd=REPO, env=_env(), capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0 and "for world size 4" in checked.stdout, checked.stdout + checked.stderr


def test_ulysses_study_measures_cp2_and_names_a_failed_ranks_error(tmp_path):
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(FAIL_ONCE)
    out = tmp_path / "ulysses"
    doc, _ = _tune(out, "--engine", "deepspeed", "--cp", "2", "--zero", "1", "--max-micro-batch", "4",
                   "--num-layers", "1", "--trials", "2", "--top-k", "2",
                   env=_env(inject, AUTOTUNE_TEST_FAIL_ONCE=str(tmp_path / "failed-once")))
    trials = sorted(_trials(out), key=lambda t: t.number)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE], \
        [(t.state, t.user_attrs.get("reason")) for t in trials]
    failed, measured = trials
    reason = failed.user_attrs["reason"]
    assert failed.user_attrs["status"] == "crashed"
    assert reason.startswith("exit code 1: RuntimeError: injected failure on rank 1 (test) (rank 1"), reason
    assert Path(failed.user_attrs["log_path"]).is_file() and failed.user_attrs["log_path"] in reason
    _check_measured(measured, "deepspeed")
    assert measured.params["cp"] == 2 and measured.params["zero_stage"] == 1
    result = next(line for line in Path(measured.user_attrs["log_path"]).read_text().splitlines()
                  if line.startswith("RESULT "))
    assert json.loads(result[len("RESULT "):])["sequence_parallel_size"] == 2  # DeepSpeed ran Ulysses
    assert doc["best"]["trial"] == measured.number
    _check_winner(doc, out, ["ds_config.json"])
    assert json.loads((out / "winner" / "ds_config.json").read_text())["sequence_parallel_size"] == 2


def test_megatron_plans_are_never_launched(tmp_path):
    for engine in ("megatron", "megatron-deepspeed"):
        out = tmp_path / engine
        done = subprocess.run([sys.executable, "-m", "autotune", "tune", *BASE, "--engine", engine, "--trials", "1",
                               "--out", str(out)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "has no built-in trainer" in done.stderr and "--workload command" in done.stderr, done.stderr
        assert "needs CUDA" in done.stderr and "Traceback" not in done.stderr
        assert not (out / "trials").exists()
