"""The memory ledger against what real DeepSpeed and real autograd hold on this machine.

Model states: ``ds_memory_probe`` runs DeepSpeed 0.19.8 on 2 gloo ranks (ZeRO 0-3, with and without
CPU optimizer offload) and walks the engine; the ledger predicts the most loaded rank's weights,
gradients and optimizer states (host and device together: on a CPU machine both are RAM).

Activations: one forward of ``autotune.workloads.transformer`` under saved-tensor hooks,
deduplicated by storage, against the ledger's per-stage activations of the same plan. The ledger
models GPU kernels; the one CPU difference this model shows is made explicit below
(:data:`CPU_LAYERNORM_STAT_BYTES`), not hidden in a tolerance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from autotune.cost.activations import stage_activation_bytes
from autotune.cost.memory import estimate_memory
from autotune.specs.settings import MemorySettings
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

__all__ = ["PROBE_CONFIGS", "Comparison", "run_deepspeed_probe", "compare_model_states", "compare_activations",
           "CPU_LAYERNORM_STAT_BYTES"]

PROBE_CONFIGS = ("zero0", "zero1", "zero2", "zero3", "zero1-offload", "zero2-offload", "zero3-offload")

# CPU LayerNorm keeps its per-token mean and rstd in the activation dtype (bf16: 2 x 2 bytes); CUDA
# keeps them in fp32 (2 x 4 bytes), which is what the ledger counts. Measured: 1,024 bytes less per norm
# at 256 tokens (autotune/workloads/measure.py, tests/workloads/test_measure.py).
CPU_LAYERNORM_STAT_BYTES = 4
GPU_LAYERNORM_STAT_BYTES = 8


@dataclass(frozen=True, slots=True)
class Comparison:
    model: str
    case: str
    category: str
    measured_bytes: float
    ledger_bytes: float

    @property
    def error(self) -> float:
        return self.ledger_bytes / self.measured_bytes - 1 if self.measured_bytes else 0.0


def run_deepspeed_probe(model_name: str, out_dir: Path, *, timeout_s: float = 900) -> dict:
    """Run the 2-rank DeepSpeed probe for ``model_name`` (every config) and return its JSON."""
    out = Path(out_dir) / f"ds_memory_{model_name}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
           "autotune.workloads.ds_memory_probe", "--model", model_name, "--configs", *PROBE_CONFIGS,
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if not out.is_file():
        raise RuntimeError(f"DeepSpeed probe for {model_name} wrote no result (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def _probe_plan(config_name: str, doc: dict) -> tuple[ParallelPlan, MemorySettings]:
    stage = int(config_name[4])
    ds = doc["results"][config_name]["config"]
    zero = ds.get("zero_optimization", {})
    dp = doc["world_size"]
    plan = ParallelPlan(dp=dp, zero_stage=stage, micro_batch_size=doc["micro_batch_size"], seq_len=doc["seq_len"],
                        global_batch_size=ds["train_batch_size"], grad_accum_steps=ds["gradient_accumulation_steps"],
                        offload_optimizer="cpu" if config_name.endswith("offload") else "none",
                        overlap_comm=bool(zero.get("overlap_comm", stage == 3)))
    bucket = doc["bucket_elements"]
    settings = MemorySettings(reduce_bucket_size=zero.get("reduce_bucket_size", bucket),
                              allgather_bucket_size=zero.get("allgather_bucket_size", bucket),
                              stage3_prefetch_bucket_size=zero.get("stage3_prefetch_bucket_size", bucket),
                              cuda_context_bytes=0, fragmentation_fraction=0.0)
    return plan, settings


def compare_model_states(doc: dict) -> list[Comparison]:
    """Ledger vs the most loaded rank, per config and category (before the optimizer step)."""
    model = load_model_preset(doc["model"]["name"]) if isinstance(doc["model"], dict) else load_model_preset(doc["model"])
    cluster = load_cluster(gpu="cpu", num_gpus=doc["world_size"], gpus_per_node=doc["world_size"], cluster_path=None)
    rows = []
    for name in PROBE_CONFIGS:
        if name not in doc["results"]:
            continue
        plan, settings = _probe_plan(name, doc)
        est = estimate_memory(model, cluster, plan, settings)
        s = est.offloaded
        assert s is not None
        ledger = {"params": s.weights + s.host_weights, "grads": s.gradients + s.host_gradients,
                  "optimizer_states": s.optimizer_states + s.host_optimizer_states}
        ranks = doc["results"][name].get("per_rank") or [doc["results"][name]]
        for category, predicted in ledger.items():
            measured = max(r["before_step"][category] for r in ranks)
            rows.append(Comparison(model.name, name, category, measured, predicted))
    return rows


def compare_activations(model_name: str, recompute: str, *, micro_batch: int = 2, seq_len: int = 128,
                        flash_attention: bool = True) -> Comparison:
    """Saved-for-backward bytes of one forward against the ledger (one GPU, no parallelism)."""
    from autotune.workloads.measure import saved_activation_bytes
    from autotune.workloads.transformer import build_model

    spec: ModelSpec = load_model_preset(model_name)
    torch.manual_seed(0)
    module = build_model(spec, seq_len=seq_len, recompute=recompute, flash_attention=flash_attention)
    ids = torch.randint(0, spec.vocab_size, (micro_batch, seq_len))
    measured = saved_activation_bytes(module, ids, ids, backward=False)["activation_bytes"]
    plan = ParallelPlan(seq_len=seq_len, micro_batch_size=micro_batch, recompute=recompute,
                        flash_attention=flash_attention)
    parts = stage_activation_bytes(spec, plan, 0)
    # During the forward only what is stored exists; the recompute working set appears in backward.
    ledger = sum(v for k, v in parts.items() if k != "recompute_working_set")
    if spec.norm == "layernorm":
        tokens = micro_batch * seq_len
        stored_layer_norms = 0 if recompute == "full" else spec.num_layers * spec.norms_per_layer
        norms = stored_layer_norms + 1 + int(spec.embedding_norm)  # + the final norm (+ embedding norm)
        ledger -= norms * tokens * (GPU_LAYERNORM_STAT_BYTES - CPU_LAYERNORM_STAT_BYTES)
    return Comparison(spec.name, f"{recompute}, {'flash' if flash_attention else 'unfused'} attention",
                      "activations", measured, ledger)
