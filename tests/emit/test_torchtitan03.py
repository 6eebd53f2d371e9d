"""torchtitan 0.3 config modules (torchtitan_plan.py): each emitted module is loaded by torchtitan 0.3.0's own
ConfigManager (``--module torchtitan_plan --config plan``, as ``python -m torchtitan.train`` resolves them) in a
subprocess whose import path starts with an isolated torchtitan 0.3.0 install (the 0.2.2 in site-packages stays
for the TOML tests), and the Trainer.Config it builds is checked against the plan. ``validate`` on a v0.2 TOML
with 0.3 installed names the version as the problem. The 0.2 choice still writes the TOML.

Tooling: torchtitan 0.3.0 and what its config import needs beyond this environment are pip-installed with
``--no-deps --target`` into ~/.cache/autotune-test-tools/torchtitan-0.3.0 (AUTOTUNE_TEST_TOOLS moves the cache),
under a file lock and an atomic rename; no PyPI: the tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tooling import tool_folder  # tests/ is on sys.path (no __init__)

from autotune.api import make_plan
from autotune.emit.options import EmitOptions
from autotune.emit.torchtitan import torchtitan_compiles
from autotune.emit.torchtitan_module import torchtitan_module
from autotune.engines.fsdp import _side_configs
from autotune.errors import InputError
from autotune.specs.layout import split_scheme, virtual_layout
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

REPO = Path(__file__).resolve().parents[2]
# (pip requirement, module it provides): torchtitan 0.3.0, and what `from torchtitan.trainer import Trainer` and the
# model recipes import that this environment may lack (torchao: Float8Linear for the fp8 converters).
PACKAGES = [("torchtitan==0.3.0", None), ("spmd_types==0.2.3", None), ("torchdata==0.11.0", "torchdata"),
            ("tensorboard==2.21.0", "tensorboard"), ("protobuf==7.36.2", "google.protobuf"),
            ("absl-py==2.5.1", "absl"), ("datasets==4.7.0", "datasets"), ("multiprocess==0.70.19", "multiprocess"),
            ("pandas==3.1.1", "pandas"), ("pyarrow==26.0.1", "pyarrow"), ("dill==0.4.1", "dill"),
            ("httpx==0.29.0", "httpx"), ("xxhash==4.1.0", "xxhash"), ("torchao==0.18.0", "torchao")]


def _missing(module: str | None) -> bool:
    try:
        return module is None or importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def torchtitan03_path() -> Path:
    """The folder holding torchtitan 0.3.0 (installed on first use); pytest.skip when pip cannot get it."""
    return tool_folder("torchtitan-0.3.0", [req for req, module in PACKAGES if _missing(module)])


# (id, model, GPUs, plan): FSDP only, FSDP + TP, PP interleaved with full AC, Float8 with selective AC, HSDP, DDP.
CASES = [
    ("fsdp", "llama3-8b", 8, dict(zero_stage=3, global_batch_size=64, recompute="selective")),
    ("fsdp-tp", "llama3-70b", 64, dict(zero_stage=3, tp=8, global_batch_size=64, recompute="full",
                                       sequence_parallel=True)),
    ("pp-interleaved", "llama3-70b", 128, dict(zero_stage=3, tp=8, pp=4, vpp=2, global_batch_size=64,
                                               recompute="full")),
    ("pp-1f1b", "llama3-405b", 256, dict(zero_stage=3, tp=8, pp=16, global_batch_size=256, recompute="full")),
    # Llama 3 405B's 126 layers on 16 x 8 virtual stages: the first chunk the embedding alone, the last the output
    ("pp-embedding-alone", "llama3-405b", 128, dict(zero_stage=3, tp=8, pp=16, vpp=8, global_batch_size=16,
                                                    recompute="full")),
    # the output as 2 layers of torchtitan's split (loss_slots) on 4 x 3 virtual stages, as module names
    ("pp-loss-slots", "llama3-8b", 32, dict(zero_stage=3, tp=2, pp=4, vpp=3, global_batch_size=16, loss_slots=2)),
    ("fp8", "llama3-8b", 16, dict(zero_stage=3, global_batch_size=64, precision="fp8", recompute="selective")),
    ("hsdp-zero2-none", "llama3-8b", 16, dict(zero_stage=2, dp_replicate=2, global_batch_size=64, recompute="none")),
    # the recipes' chunked loss (ChunkedLossWrapper, 8 chunks) as a plan setting, with the rowwise Float8 recipe
    ("chunked-loss-rowwise", "llama3-8b", 16, dict(zero_stage=3, global_batch_size=64, precision="fp8",
                                                   fp8_recipe="torchao-rowwise", loss_chunks=8,
                                                   recompute="selective")),
    # MXFP8 on Blackwell, TP under torch.compile (0.3's MXFP8LinearConverter takes the two together; 0.2.2 refused it)
    ("mxfp8-tp-compiled", "llama3-8b", 16, dict(zero_stage=3, tp=2, sequence_parallel=True, global_batch_size=64,
                                                precision="fp8", fp8_recipe="torchao-mxfp8", torch_compile=True,
                                                recompute="selective")),
    # a sequence past the 671B flavor's 16,384 RoPE positions, which 0.3.0's trainer refuses unless raised
    ("deepseek-32k", "deepseek-v3", 256, dict(zero_stage=3, global_batch_size=256, seq_len=32768, recompute="full")),
]


def _plan(model: str, num_gpus: int, kw: dict):
    m = load_model_preset(model)
    gpu = "b200" if kw.get("fp8_recipe") == "torchao-mxfp8" else "h100-sxm-80gb"  # MXFP8: compute capability 10.0+
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus)
    return m, cluster, make_plan(m, cluster, engine="fsdp", **{"seq_len": 4096, **kw})


# Runs under torchtitan 0.3.0: loads each folder's torchtitan_plan.py the way `-m torchtitan.train` does, and prints
# what the Trainer.Config holds. No GPU here: the Float8 and MXFP8 converters' hardware checks are told yes (an H100
# for Float8, a B200 for MXFP8).
PROBE = r"""
import dataclasses, json, re, sys
import torchtitan, torchtitan.components.quantization.float8 as f8, torchtitan.components.quantization.mx as mx
from torchtitan.config import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims
f8.has_cuda_capability = lambda major, minor: True
mx.has_cuda_capability = lambda major, minor: True
out = {"version": torchtitan.__version__}
for folder, world, extra in json.loads(sys.argv[1]):
    sys.path.insert(0, folder)
    sys.modules.pop("torchtitan_plan", None)
    cfg = ConfigManager().parse_args(["--module", "torchtitan_plan", "--config", "plan", *extra])
    sys.path.remove(folder)
    dims = ParallelDims.from_config(cfg.parallelism, world)
    model = cfg.model_spec.model
    model.update_from_config(config=cfg)  # what the trainer asks first: the sequence against the RoPE tables, TP
    ckpt = cfg.checkpoint
    out[folder] = {
        "module": sys.modules["torchtitan_plan"].__file__, "flavor": cfg.model_spec.flavor,
        "parallelism": dataclasses.asdict(cfg.parallelism), "training": dataclasses.asdict(cfg.training),
        "dims": [dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.pp, dims.ep],
        "ac": type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint else None,
        "compile": [cfg.compile.enable, list(cfg.compile.components)],
        "float8": sorted({re.sub(r"^layers\.\d+\.", "layers.*.", fqn)
                          for fqn, *_ in model.traverse(f8.Float8Linear.Config)}),
        "mxfp8": sorted({re.sub(r"^layers\.\d+\.", "layers.*.", fqn)
                         for fqn, *_ in model.traverse(mx.MXFP8Linear.Config)}),
        "layers": len(model.layers),
        "rope": sorted({layer.attention.rope.max_seq_len for layer in model.layers if layer.attention is not None}),
        "checkpoint": [ckpt.enable, ckpt.folder, ckpt.interval, ckpt.keep_latest_k, ckpt.async_mode],
        "optimizer": {k: list(v) if isinstance(v, tuple) else v
                      for k, v in cfg.optimizer.param_groups[0].optimizer_kwargs.items()},
        "lr_scheduler": [cfg.lr_scheduler.warmup_steps, cfg.lr_scheduler.decay_type, cfg.lr_scheduler.min_lr_factor],
        "log_freq": cfg.metrics.log_freq,
        "loss": [type(cfg.loss).__qualname__, getattr(cfg.loss, "num_chunks", None)],
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """What torchtitan 0.3.0's ConfigManager built from each case's module (one subprocess for all)."""
    tools = torchtitan03_path()
    root = tmp_path_factory.mktemp("tt03")
    jobs, folders = [], {}
    for case, model, num_gpus, kw in CASES:
        m, cluster, plan = _plan(model, num_gpus, kw)
        folder = root / case
        folder.mkdir()
        (folder / "torchtitan_plan.py").write_text(torchtitan_module(m, cluster, plan))
        extra = ["--training.steps", "7"] if case == "fsdp" else []  # a --section.key override on top
        jobs.append([str(folder), num_gpus, extra])
        folders[case] = (str(folder), m, cluster, plan)
    env = {**os.environ, "PYTHONPATH": str(tools)}
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(jobs)], capture_output=True, text=True,
                         env=env, cwd=root, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(run.stdout.strip().splitlines()[-1])
    assert data["version"] == "0.3.0"
    return {case: (data[folder], m, cluster, plan) for case, (folder, m, cluster, plan) in folders.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_torchtitan_03_config_manager_builds_the_plan(loaded, case):
    got, m, cluster, plan = loaded[case]
    assert got["module"].endswith(f"{case}/torchtitan_plan.py")  # resolved by name from the import path
    pa, tr = got["parallelism"], got["training"]
    replicate = plan.dp if plan.zero_stage == 0 else plan.dp_replicate
    assert got["dims"] == [replicate, plan.dp // replicate, plan.cp, plan.tp, plan.pp, plan.ep]
    assert pa["fsdp_reshard_after_forward"] == ("always" if plan.zero_stage == 3 else "never")
    assert pa["enable_sequence_parallel"] == plan.sequence_parallel
    assert tr["seq_len"] == plan.seq_len and tr["global_batch_size"] == plan.global_batch_size
    assert tr["local_batch_size"] == plan.micro_batch_size * (plan.grad_accum_steps if plan.pp > 1 else 1)
    assert (tr["mixed_precision_param"], tr["mixed_precision_reduce"]) == ("bfloat16", "float32")
    assert tr["steps"] == (7 if case == "fsdp" else EmitOptions().optimizer.train_steps)
    assert got["ac"] == {"full": "FullAC.Config", "selective": "SelectiveAC.Config", "none": None}[plan.recompute]
    if plan.pp > 1:
        assert pa["pipeline_parallel_schedule"] == ("Interleaved1F1B" if plan.vpp > 1 else "1F1B")
        assert pa["pipeline_parallel_microbatch_size"] == plan.micro_batch_size and tr["disable_cuda_graphs"]
        parts = pa["module_fqns_per_model_part"]
        scheme = split_scheme("any", None, m.num_layers, plan.pp, plan.vpp, plan.loss_slots)
        assert [len([n for n in p if n.startswith("layers.")]) for p in parts] == \
            list(virtual_layout(m.num_layers, plan.pp, plan.vpp, scheme))
        assert pa["pipeline_parallel_last_stage_less_layers"] == (plan.loss_slots or 1)
        assert sum(parts, []) == ["tok_embeddings", *(f"layers.{i}" for i in range(got["layers"])), "norm", "lm_head"]
        if case == "pp-embedding-alone":
            assert parts[0] == ["tok_embeddings"] and parts[-1] == ["norm", "lm_head"]
    else:
        assert pa["module_fqns_per_model_part"] is None
    o = EmitOptions()
    assert got["optimizer"] == {"lr": o.optimizer.lr, "betas": list(o.optimizer.betas), "eps": o.optimizer.eps,
                                "weight_decay": o.optimizer.weight_decay}
    assert got["lr_scheduler"] == [o.optimizer.warmup_steps, "cosine", o.optimizer.min_lr / o.optimizer.lr]
    assert got["checkpoint"] == [True, o.checkpoint.save_dir, 500, o.checkpoint.keep_last, "async"]
    assert got["log_freq"] == o.steps_per_print and got["layers"] == m.num_layers
    assert got["rope"] == [plan.seq_len]  # the trainer's resize, past the flavor's tables where the module raised them
    assert got["compile"] == [torchtitan_compiles(plan), ["model", "loss"]]
    # the loss the estimate assumed: the plan's chunks, else the recipe's inner loss unchunked
    assert got["loss"] == (["ChunkedLossWrapper.Config", plan.loss_chunks] if (plan.loss_chunks or 1) > 1
                           else ["CrossEntropyLoss.Config", None]), got["loss"]
    mx = plan.fp8_recipe == "torchao-mxfp8"
    if plan.precision == "fp8":  # the linears of every block in float8 / MXFP8, the output layer (lm_head) not
        quantised = got["mxfp8" if mx else "float8"]
        assert quantised and all(f.startswith("layers.*.") for f in quantised), quantised
        assert {"attention", "feed_forward"} <= {f.split(".")[2] for f in quantised}, quantised
        assert got["float8" if mx else "mxfp8"] == []
    else:
        assert got["float8"] == [] and got["mxfp8"] == []


@pytest.mark.slow
def test_validate_names_the_version_when_torchtitan_03_is_installed(tmp_path):
    tools = torchtitan03_path()
    m, cluster, plan = _plan("llama3-8b", 8, dict(zero_stage=3, global_batch_size=64))
    files, _ = _side_configs(m, cluster, plan, EmitOptions(torchtitan_version="0.2"))
    path = tmp_path / "torchtitan_job.toml"
    path.write_text(files["torchtitan_job.toml"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tools), str(REPO)])}
    run = subprocess.run([sys.executable, "-m", "autotune", "validate", str(path), "--world-size", "8"],
                         capture_output=True, text=True, env=env, timeout=600)
    text = run.stdout + run.stderr
    assert run.returncode == 1, text
    assert "version mismatch" in text and "is for torchtitan 0.2" in text and "(installed: 0.3.0)" in text
    assert "no TOML job configs" in text and "--engine-version fsdp=0.3" in text
    assert "fix the config" not in text


def test_the_version_chooses_the_file():
    m, cluster, plan = _plan("llama3-8b", 8, dict(zero_stage=3, global_batch_size=64))
    new, _ = _side_configs(m, cluster, plan, EmitOptions())
    old, _ = _side_configs(m, cluster, plan, EmitOptions(torchtitan_version="0.2"))
    assert "torchtitan_plan.py" in new and "torchtitan_job.toml" not in new
    assert "torchtitan_job.toml" in old and "torchtitan_plan.py" not in old
    assert "[parallelism]" in old["torchtitan_job.toml"]
    compile(new["torchtitan_plan.py"], "torchtitan_plan.py", "exec")
    with pytest.raises(InputError, match="torchtitan_version"):
        EmitOptions(torchtitan_version="0.4")


def test_interleaved_toml_keeps_pp_x_vpp_stages():
    # torchtitan (0.2.2 and 0.3.0 pipeline_parallel.py): stages = ceil((layers + first_less + last_less) /
    # layers_per_stage); with the defaults 1 and 1, 80 layers at 10 per stage made 9 stages for pp 4 x vpp 2.
    m, cluster, plan = _plan("llama3-70b", 128, dict(zero_stage=3, tp=8, pp=4, vpp=2, global_batch_size=64))
    old, _ = _side_configs(m, cluster, plan, EmitOptions(torchtitan_version="0.2"))
    import tomllib
    p = tomllib.loads(old["torchtitan_job.toml"])["parallelism"]
    stages = -(-(m.num_layers + p["pipeline_parallel_first_stage_less_layers"]
                 + p["pipeline_parallel_last_stage_less_layers"]) // p["pipeline_parallel_layers_per_stage"])
    assert stages == plan.pp * plan.vpp


def test_plans_torchtitan_03_cannot_express():
    m, cluster, plan = _plan("llama3-70b", 64, dict(zero_stage=3, tp=8, pp=4, global_batch_size=64,
                                                    recompute="full", recompute_num_layers=5))
    with pytest.raises(InputError, match="FullAC"):
        torchtitan_module(m, cluster, plan)
    tiny = load_model_preset("tiny-llama")
    c8 = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = make_plan(tiny, c8, engine="fsdp", zero_stage=3, global_batch_size=8, seq_len=128)
    files, notes = _side_configs(tiny, c8, plan, EmitOptions())
    assert "torchtitan_plan.py" not in files and any("--torchtitan-version 0.2" in n for n in notes)


@pytest.mark.slow
def test_rope_positions_table_is_torchtitan_03s():
    """ROPE_POSITIONS_03: each mapped flavor's RoPE max_seq_len, as torchtitan 0.3.0's model_registry builds it."""
    from autotune.emit.torchtitan_recipes import ROPE_POSITIONS_03, TORCHTITAN_03_RECIPES

    assert set(ROPE_POSITIONS_03) == set(TORCHTITAN_03_RECIPES)
    jobs = {p: (TORCHTITAN_03_RECIPES[p][0], TORCHTITAN_03_RECIPES[p][2]) for p in ROPE_POSITIONS_03}
    probe = ("import importlib, json, sys\nout = {}\n"
             "for preset, (package, flavor) in json.loads(sys.argv[1]).items():\n"
             "    spec = importlib.import_module(f'torchtitan.models.{package}').model_registry(flavor)\n"
             "    out[preset] = sorted({l.attention.rope.max_seq_len for l in spec.model.layers})\n"
             "print(json.dumps(out))")
    env = {**os.environ, "PYTHONPATH": str(torchtitan03_path())}
    run = subprocess.run([sys.executable, "-c", probe, json.dumps(jobs)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {p: [n] for p, n in ROPE_POSITIONS_03.items()}


def test_a_longer_sequence_raises_the_flavors_rope_tables_and_says_so():
    m, cluster, plan = _plan("deepseek-v3", 256, dict(zero_stage=3, global_batch_size=256, seq_len=32768))
    files, notes = _side_configs(m, cluster, plan, EmitOptions())
    assert "_rope_positions(model_registry('671B'" in files["torchtitan_plan.py"]
    assert any("16,384 positions" in n and "32,768" in n for n in notes)
    m, cluster, plan = _plan("deepseek-v3", 256, dict(zero_stage=3, global_batch_size=256, seq_len=16384))
    files, notes = _side_configs(m, cluster, plan, EmitOptions())
    assert "_rope_positions" not in files["torchtitan_plan.py"] and not any("RoPE tables" in n for n in notes)
