"""DeepSpeed plans of a mixture of experts run without tensor parallelism (rule deepspeed:moe_tp): AutoTP shards
nn.Linear layers only and transformers 5's experts are 3-D parameters, so each TP rank keeps all experts, which
the ledger split tp ways. GPT-OSS-20B on 8 H100 ranked tp2 pp1 dp4 ds-zero1 first under --engine deepspeed at
74.5 GiB; with the experts whole its weights alone are 39 GiB instead of 19.5. The slow test measures it on the
real software (DeepSpeed's AutoTP, transformers' Mixtral and Qwen3-MoE, 2 CPU ranks)."""
from __future__ import annotations

import os
import sys

import pytest
from conftest import run_launcher  # a rank's rare native abort at exit: started once more (conftest.NATIVE_ABORT)

from autotune.api import make_plan
from autotune.errors import InputError
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model

CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)


def test_no_autotp_for_experts():
    model = load_model("gpt-oss-20b")
    with pytest.raises(InputError) as err:
        make_plan(model, CLUSTER, engine="deepspeed", tp=2, zero_stage=1, global_batch_size=256, seq_len=4096)
    assert "AutoTP shards nn.Linear layers only" in str(err.value)
    make_plan(load_model("llama3-8b"), CLUSTER, engine="deepspeed", tp=2, zero_stage=1, global_batch_size=256,
              seq_len=4096)  # dense: AutoTP splits it all
    result = search_plans(model, CLUSTER, global_batch_size=256, seq_len=4096,
                          constraints=SearchConstraints(engines=("deepspeed",)))
    assert result.rejections.get("deepspeed:moe_tp")
    assert result.ranked and all(est.plan.tp == 1 for est in result.ranked)


PROBE = r'''
import sys, deepspeed, deepspeed.comm as dist
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
deepspeed.init_distributed(dist_backend="gloo")
if sys.argv[1] == "mixtral":
    model = MixtralForCausalLM(MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2))
else:
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=2, head_dim=16))
config = {"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}, "zero_optimization": {"stage": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
if dist.get_rank() == 0:
    for name, p in engine.module.named_parameters():
        print("SHAPE", name, *p.shape)
'''


@pytest.mark.slow
@pytest.mark.parametrize("family, experts, width", [("mixtral", 4, 2 * 128), ("qwen3", 4, 2 * 32)])
def test_autotp_leaves_transformers_experts_whole(tmp_path, free_port, family, experts, width):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    run = run_launcher([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(free_port), str(script), family], timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    shapes = {parts[1]: tuple(int(x) for x in parts[2:]) for line in run.stdout.splitlines()
              if (parts := line.split())[:1] == ["SHAPE"]}
    assert shapes, run.stdout[-2000:] + run.stderr[-3000:]
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (32, 64)  # AutoTP halves attention (4 heads x 16)
    gate_up = shapes["model.layers.0.mlp.experts.gate_up_proj"]
    assert gate_up[0] == experts and width in gate_up  # every expert, whole, on this TP rank
