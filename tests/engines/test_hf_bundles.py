"""HF bundles train as emitted: `autotune emit --engine hf`, then
- `bash launch_torchrun.sh` (from another folder): `python -m autotune.train --hf-config ds_config_hf.json`,
  the Hugging Face Trainer filling the file's "auto" values from TrainingArguments;
- `bash launch_accelerate.sh`: `accelerate launch --config_file accelerate_config.yaml` with the concrete
  ds_config_accelerate.json (accelerate 1.16 refuses duplicated variables: the YAML has none).
Both on 2 gloo ranks, 6 optimizer steps; the first-step loss is the same model and batches computed here.
"""

from __future__ import annotations

import json

import pytest
from test_deepspeed_bundles import (  # tests/engines is on sys.path (no __init__)
    _plan,
    emit,
    run_script,
)

# run_script passes a free MASTER_PORT; the default port is held busy meanwhile; the ops are built first.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("default_port_taken", "deepspeed_ops")]


def _reference_first_step(bundle) -> float:
    """Mean loss of the first optimizer step's micro-batches on rank 0 (what both trainers draw first)."""
    import torch

    from autotune.train.hf import _tokens
    from autotune.train.hf_models import build_hf_model

    spec, plan = _plan(bundle)
    torch.manual_seed(1234)
    model = build_hf_model(spec, seq_len=plan.seq_len, dtype=torch.bfloat16)
    return model, _tokens(spec, plan, plan.global_batch_size * 6, 1234)


def test_hf_trainer_bundle_fills_auto_and_trains(tmp_path):
    bundle = emit(tmp_path, 2, 2, "hf", "--zero", "2", "--global-batch", "4")
    cfg = json.loads((bundle / "ds_config_hf.json").read_text())
    assert cfg["train_batch_size"] == "auto" and cfg["optimizer"]["params"]["betas"] == "auto"
    result = run_script(bundle, "launch_torchrun.sh", cwd=tmp_path)
    assert result["driver"] == "transformers.Trainer" and result["zero_stage"] == 2 and result["world_size"] == 2
    assert all(5 < loss < 8 for loss in result["losses"])  # ln(1024) = 6.93 at the start
    # each step's LOSS line carries the loss the Trainer logs after the step ends (not nan)
    assert result["printed_losses"] == result["losses"]


def test_accelerate_bundle_trains_and_matches_one_process(tmp_path):
    bundle = emit(tmp_path, 2, 2, "hf", "--zero", "2", "--global-batch", "2")
    result = run_script(bundle, "launch_accelerate.sh", cwd=tmp_path)
    assert result["driver"] == "accelerate" and result["distributed_type"] == "DistributedType.DEEPSPEED"
    model, data = _reference_first_step(bundle)
    first = data[0]  # rank 0's first micro-batch (rank r takes rows r, r + world, ...)
    import torch

    with torch.no_grad():
        loss = float(model(input_ids=first["input_ids"][None], labels=first["labels"][None]).loss)
    assert result["losses"][0] == pytest.approx(loss, rel=2e-3)


MOE = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 128}
GEMMA2 = {"activation": "geglu", "norms_per_layer": 4, "norm_zero_centered": True, "scaled_embeddings": True,
          "tied_embeddings": True, "attn_logit_softcap": 50.0, "final_logit_softcap": 30.0,
          "query_pre_attn_scalar": 24.0, "sliding_window": 16, "sliding_window_layers": [0]}


SIGMOID_MOE = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 128, "num_shared_experts": 1,
               "num_dense_layers": 1, "router_bias": True, "router_score": "sigmoid", "router_scaling_factor": 2.5}
DEEPSEEK = {"num_kv_heads": 8, "moe": {**SIGMOID_MOE, "router_groups": 2, "router_group_topk": 1},
            "mla": {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                    "q_lora_rank": 48}}
GLM = {"qkv_bias": True, "qk_norm": "head", "rotary_fraction": 0.5, "head_dim": 32, "moe": SIGMOID_MOE}


@pytest.mark.parametrize("fields, built", [({"qk_norm": "head"}, "Qwen3ForCausalLM"),
                                           ({"qkv_bias": True}, "Qwen2ForCausalLM"),
                                           ({"moe": MOE}, "MixtralForCausalLM"),
                                           ({"qk_norm": "head", "moe": MOE}, "Qwen3MoeForCausalLM"),
                                           (GEMMA2, "Gemma2ForCausalLM"), (DEEPSEEK, "DeepseekV3ForCausalLM"),
                                           (GLM, "Glm4MoeForCausalLM")])
def test_other_architectures_train_as_their_transformers_class(tmp_path, fields, built):
    """A Qwen3-style model (per-head Q/K RMSNorm), a Qwen2-style one (Q/K/V biases), a Mixtral-style MoE, a
    Qwen3-MoE-style one, a Gemma-2-style one (its first layer windowed), a DeepSeek-V3-style one (MLA, a dense
    first layer, a sigmoid group-limited router with a shared expert) and a GLM-4.5-style one (Q/K/V biases, Q/K
    norm, RoPE on half of each head, the same router ungrouped) train through the emitted accelerate launch
    (DeepSpeed ZeRO-2) as transformers' own class, the first loss that model's on the same batch."""
    bundle = emit(tmp_path, 2, 2, "hf", "--zero", "2", "--global-batch", "2", name="tiny-other-2l", **fields)
    result = run_script(bundle, "launch_accelerate.sh", cwd=tmp_path)
    model, data = _reference_first_step(bundle)
    assert type(model).__name__ == built
    first = data[0]
    import torch

    with torch.no_grad():
        loss = float(model(input_ids=first["input_ids"][None], labels=first["labels"][None]).loss)
    assert result["losses"][0] == pytest.approx(loss, rel=2e-3)
