"""Megatron-DeepSpeed MoE plans with a pipeline and tp > 1 write DeepSpeed's pipeline partitioning off: the MoE layers
send their aggregated loss between stages beside the activation, and DeepSpeed's pipeline engine, which partitions
what it sends over the tp ranks by default when tp > 1, asserts that no tensor but the first needs a gradient
(runtime/pipe/engine.py:736). The emitted Mixtral plan tp2 pp4 ep4 stopped there at its first step. The slow test
runs DeepSpeed's own PipelineModule on 4 CPU ranks (pp 2 x tp 2) with a stage that sends such a pair: the default
fails that assertion, the emitted block trains."""
from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import run_launcher  # a rank's rare native abort at exit: started once more (conftest.NATIVE_ABORT)

from autotune.api import make_plan
from autotune.bundle.writer import render_bundle
from autotune.cost.estimate import estimate
from autotune.specs.loading import load_cluster, load_model

CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=32)


def _ds_config(model: str, **kw) -> dict:
    m = load_model(model)
    plan = make_plan(m, CLUSTER, engine="megatron-deepspeed", zero_stage=1, global_batch_size=512, seq_len=4096, **kw)
    return json.loads(render_bundle(estimate(m, CLUSTER, plan)).files["ds_config.json"])


def test_moe_with_pipeline_and_tp_turns_partitioning_off():
    pipeline = _ds_config("mixtral-8x7b", tp=2, pp=4, ep=4, sequence_parallel=True)["pipeline"]
    assert pipeline == {"activation_checkpoint_interval": 0, "pipe_partitioned": False, "grad_partitioned": False}
    for model, kw in (("mixtral-8x7b", {"tp": 1}), ("llama3-8b", {"tp": 2, "sequence_parallel": True})):
        # nothing partitioned without tp; a dense model sends one tensor
        assert "pipe_partitioned" not in _ds_config(model, pp=4, ep=4 if model == "mixtral-8x7b" else 1, **kw)[
            "pipeline"]


PROBE = r'''
import json, sys, torch, deepspeed, deepspeed.comm as dist
from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
deepspeed.init_distributed(dist_backend="gloo")

class First(torch.nn.Module):  # a stage output as the fork's MoE layers send it: (hidden, aggregated aux loss)
    def __init__(self):
        super().__init__(); self.lin = torch.nn.Linear(8, 8)
    def forward(self, x):
        h = self.lin(x)
        return h, (h * h).mean()

class Second(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.lin = torch.nn.Linear(8, 8)
    def forward(self, inputs):
        h, aux = inputs
        return self.lin(h).sum(-1) + aux

topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=1)
model = PipelineModule(layers=[First(), Second()], topology=topo, loss_fn=lambda out, y: ((out - y) ** 2).mean())
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}, **json.loads(sys.argv[1])}
engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config)
loss = engine.train_batch(data_iter=iter([(torch.randn(2, 8), torch.randn(2)) for _ in range(4)]))
if dist.get_rank() == 0:
    print("TRAINED", float(loss), flush=True)
'''


@pytest.mark.slow
def test_deepspeeds_pipeline_engine_needs_partitioning_off(tmp_path, free_port):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    emitted = {"pipeline": _ds_config("mixtral-8x7b", tp=2, pp=4, ep=4, sequence_parallel=True)["pipeline"]}
    results = {}
    for name, extra in (("default", {}), ("emitted", emitted)):
        run = run_launcher([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port",
                            str(free_port), str(script), json.dumps(extra)], timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        results[name] = (run.returncode, run.stdout + run.stderr)
    code, out = results["default"]
    assert code != 0 and "requires_grad is False for elt in outputs[1:]" in out, out[-3000:]
    code, out = results["emitted"]
    assert code == 0 and "TRAINED" in out, out[-3000:]
