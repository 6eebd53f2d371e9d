"""Op-level selective activation checkpointing: the built-in FSDP trainer's (torchtitan 0.2.2's policy, applied by
``autotune.train.fsdp_model.apply_ac``) against the ledger's op-sac term, on one process of this CPU.

The trainer's stage module runs one forward under saved-tensor hooks and a dispatch mode
(``autotune.workloads.measure.saved_activation_bytes``: what autograd saves plus what stays alive, which is where
SAC's cache of the saved ops' outputs lives); the ledger (the fsdp engine's activation facts) must agree within 1%.
The ops the policy sees are checked against the ledger's list of a block's mm calls, and training under the
policy must give the gradients training without it gives.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.cost.activations import block_linears, block_mms, stage_activation_bytes
from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.memory import estimate_memory
from autotune.cost.step_time import TimeSettings
from autotune.cost.tp_pairing import op_sac_gathers
from autotune.engines import engine_for
from autotune.report import assumed_settings
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.specs.settings import MemorySettings
from autotune.train.fsdp_model import StageModule, apply_ac, lm_loss, op_sac_save_ops
from autotune.workloads.measure import saved_activation_bytes
from autotune.workloads.transformer import build_model

SEQ, BATCH = 64, 2


class _Loss(nn.Module):
    def __init__(self, stage: StageModule) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, ids, labels):
        return lm_loss(self.stage(ids), labels)


def _trainer_stage(name: str, recompute: str) -> StageModule:
    spec = load_model_preset(name)
    torch.manual_seed(0)
    full = build_model(spec, seq_len=SEQ, recompute="none")
    stage = StageModule(full, 0, spec.num_layers, has_embedding=True, has_head=True)
    apply_ac(stage, recompute, None)
    return stage


def _run(name: str, recompute: str, *, grads: bool = True) -> tuple[dict, dict]:
    spec = load_model_preset(name)
    model = _Loss(_trainer_stage(name, recompute))
    ids = torch.randint(0, spec.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    measured = saved_activation_bytes(model, ids, ids, backward=False)
    if not grads:
        return measured, {}
    model.zero_grad(set_to_none=True)
    model(ids, ids).backward()
    return measured, {n.replace("_checkpoint_wrapped_module.", ""): p.grad.float() for n, p in model.named_parameters()}


def _ledger(name: str, recompute: str) -> float:
    spec = load_model_preset(name)
    plan = ParallelPlan(engine="fsdp", seq_len=SEQ, micro_batch_size=BATCH, recompute=recompute)
    parts = stage_activation_bytes(spec, plan, 0, engine_for(plan).activation_facts(plan))
    return sum(v for k, v in parts.items() if k not in ("recompute_working_set", "loss_backward"))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt"])
def test_op_sac_keeps_what_the_ledger_says(name):
    spec = load_model_preset(name)
    runs = {rc: _run(name, rc, grads=rc != "full") for rc in ("none", "selective", "full")}
    kept = {rc: m["activation_bytes"] for rc, (m, _) in runs.items()}
    assert kept["full"] < kept["selective"] < kept["none"]
    ledger = _ledger(name, "selective")
    if spec.norm == "layernorm":  # CPU LayerNorm keeps bf16 statistics, CUDA fp32 (ledger_check): the final norm's
        ledger -= BATCH * SEQ * 4
    assert ledger == pytest.approx(kept["selective"], rel=0.01)
    # what SAC keeps is outside the saved-tensor hooks (its cache): the measure must see it as retained
    assert runs["selective"][0]["checkpoint_held_bytes"] > 0
    ref, got = runs["none"][1], runs["selective"][1]  # the same gradients as without recompute (bf16 noise)
    assert max(float((got[n] - ref[n]).norm() / ref[n].norm()) for n in ref) < 0.02


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name, change", [("tiny-llama", {}), ("tiny-gpt", {}), ("tiny-llama", {"qkv_bias": True})])
def test_a_block_runs_the_mms_the_ledger_counts(name, change):
    spec = dataclasses.replace(load_model_preset(name), num_layers=1, **change)
    full = build_model(spec, seq_len=16)
    stage = StageModule(full, 0, 1, has_embedding=False, has_head=False)
    apply_ac(stage, "selective", None)
    x = torch.randn(2, 16, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with _Ops() as ops:
        stage(x)
    mm, addmm = torch.ops.aten.mm.default, torch.ops.aten.addmm.default
    assert ops.seen.count(mm) == len(block_mms(spec))
    assert ops.seen.count(addmm) == sum(biased for *_, biased in block_linears(spec))
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in ops.seen
    assert {mm, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default} <= op_sac_save_ops()


def test_the_fsdp_engine_estimates_op_sac_and_its_03_release_its_own():
    plan = ParallelPlan(engine="fsdp", dp=8, seq_len=8192, micro_batch_size=1, global_batch_size=8,
                        recompute="selective")
    engine = engine_for(plan)
    assert engine.activation_facts(plan).selective == "op-sac"
    assert engine.release_cost_settings("0.3") == {"selective_policy": "op-sac-0.3"}
    model = load_model_preset("llama3-8b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=8, cluster_path=None)
    total = {p: estimate_memory(model, cluster, plan, MemorySettings(selective_policy=p)).total
             for p in (None, "op-sac", "attention-core")}
    assert total[None] == total["op-sac"] < total["attention-core"]


def test_the_estimate_names_the_policy_it_assumed():
    plan = ParallelPlan(engine="fsdp", dp=8, seq_len=4096, global_batch_size=8, recompute="selective")
    assert any("op-level SAC" in s and "Float8" not in s for s in assumed_settings(plan, TimeSettings()))
    assert any("Float8 GEMM outputs kept" in s
               for s in assumed_settings(plan, TimeSettings(selective_policy="op-sac-0.3")))
    megatron = assumed_settings(plan.with_(engine="megatron"), TimeSettings())
    assert any(s.startswith("selective recompute reruns core_attn") for s in megatron)


def test_op_sac_gathers_the_tp_inputs_again_and_async_tp_hides_what_its_reruns_cover():
    """torchtitan's op-level SAC does not save all_gather_into_tensor: with TP + SP both input gathers rerun in
    backward; async TP hides each behind the rerun projections that read it (bf16: wk, narrow, and w3; Float8: all
    of them, so less waits), and without TP there is nothing to gather."""
    model = load_model_preset("llama3-8b")

    def gemm_s(flops, m, k, n, peak, eff):
        return flops / 500e12

    def plan(tp, precision):
        return ParallelPlan(tp=tp, dp=1, micro_batch_size=12, global_batch_size=12, grad_accum_steps=1,
                            seq_len=8192, engine="fsdp", zero_stage=3, sequence_parallel=tp > 1,
                            recompute="selective", precision=precision)

    gather = 2e-3
    total, exposed = op_sac_gathers(model, plan(8, "bf16"), gather, gemm_s, "linear", DEFAULT_EFFICIENCY)
    assert total == 2 * gather and 0 < exposed < gather  # wk's 128 columns per rank cover little, w3 all
    _, fp8_exposed = op_sac_gathers(model, plan(8, "fp8"), gather, gemm_s, "linear", DEFAULT_EFFICIENCY)
    assert fp8_exposed < exposed
    assert op_sac_gathers(model, plan(1, "bf16"), gather, gemm_s, "linear", DEFAULT_EFFICIENCY) == (0.0, 0.0)
