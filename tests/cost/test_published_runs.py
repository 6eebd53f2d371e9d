"""Every published run (both files in autotune/data/published_runs) as a plan of the engine it ran on, and the
step-time model's in-sample error per family (the bench prints the tables and the leave-one-family-out errors:
``python bench/accuracy_published.py``)."""


import pytest

from autotune.cost.published_runs import plan_choice_note, predict_run, published_runs
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

RUNS = published_runs()
BY_ID = {r.run_id: r for r in RUNS}
# What a run may be left out for: none of these is an engine limit.
OUT_OF_SCOPE = ("single-layer timing", "a TPU run", "no single model configuration")

def test_both_files_are_read_with_every_run_named():
    assert len(RUNS) == 75 and len(BY_ID) == 75
    assert all(r.source for r in RUNS)


def test_no_run_is_inexpressible_on_its_engine():
    inexpressible = [(r.run_id, r.engine, r.skipped) for r in RUNS
                     if r.skipped and not any(why in r.skipped for why in OUT_OF_SCOPE)]
    assert inexpressible == []


@pytest.mark.parametrize("run_id, engine, layers, pp, tp", [
    ("bloom-prequel-176b-tp4pp12dp8-mbs2-h128", "megatron-deepspeed", 70, 12, 4),
    ("llama3-405b-8k-16384gpu", "fsdp", 126, 16, 8),
    ("torchtitan-h100-l3-405b-512gpu-1f1b", "fsdp", 126, 8, 8),
])
def test_the_hard_layouts_are_plans_of_their_engine(run_id, engine, layers, pp, tp):
    run = BY_ID[run_id]
    assert run.candidates and run.model.num_layers == layers
    assert all(p.engine == engine and p.pp == pp and p.tp == tp for p in run.candidates)
    assert all(not plan_problems(run.model, run.cluster, p) for p in run.candidates)


def test_llama3_126_layers_on_16_stages_with_tp8_and_cp16():
    model = load_model_preset("llama3-405b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=2048, gpus_per_node=None, cluster_path=None)
    plan = ParallelPlan(tp=8, pp=16, cp=16, dp=1, micro_batch_size=1, global_batch_size=16, grad_accum_steps=16,
                        seq_len=131072, engine="fsdp", zero_stage=2, sequence_parallel=True, recompute="full")
    assert plan_problems(model, cluster, plan) == []


def test_every_run_with_a_throughput_is_estimated():
    timed = [r for r in RUNS if r.tokens_per_s_per_gpu and not r.skipped]
    assert len(timed) >= 64
    assert all(predict_run(r)[0] > 0 for r in timed)


def test_the_fsdp_papers_175b_is_read_as_gpt3_on_plain_fsdp():
    # published_facts.READINGS: GPT-3 175B's shape, 512 GPUs, no TP/PP, minGPT's unfused attention, and 186
    # TFLOP/s of executed FLOPs (with activation checkpointing: 4/3 of the model FLOPs per token).
    from autotune.cost.flops import step_flops

    run = BY_ID["fsdp-paper-gpt175b-bs2"]
    m = run.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == (96, 12288, 96, 50000)
    assert run.cluster.num_gpus == 512 and run.candidates
    assert all((p.tp, p.pp, p.dp, p.zero_stage, p.micro_batch_size, p.recompute, p.flash_attention)
               == (1, 1, 512, 3, 2, "full", False) for p in run.candidates)
    per_token = step_flops(m, 2048, 1.0, "full").hardware
    assert run.tokens_per_s_per_gpu == pytest.approx(186e12 / per_token)


def test_an_mfu_without_a_peak_is_read_against_the_gpu_presets_datasheet_peak():
    # Megatron-LM README strong scaling: "MFU 47%" at 96 H100s, no peak in the entry; the README's MFUs are its
    # TFLOP/s over 989 (the H100 preset's bf16 peak).
    from autotune.cost.flops import step_flops

    run = BY_ID["megatron-core-h100-strong-gpt3-96gpu"]
    assert not run.skipped and run.candidates
    per_token = step_flops(run.model, 4096, 1.0, "none").model
    assert run.tokens_per_s_per_gpu == pytest.approx(0.47 * 989e12 / per_token)


def test_plan_choice_note_says_when_the_ledger_chose_the_plan():
    import dataclasses

    from autotune.cost.published_runs import plan_choice_note

    # Korthikanti 1T: vpp is not in the source, so every vpp is a candidate; the note names any faster one the
    # ledger rejected, and is empty exactly when the fastest candidate fits.
    run = BY_ID["korthikanti22-t5-1t-selective-sp"]
    note = plan_choice_note(run)
    value, plan, _, mem = predict_run(run)
    assert mem.fits
    alone = [predict_run(dataclasses.replace(run, candidates=(p,))) for p in run.candidates if p != plan]
    faster_rejected = any(not m.fits and v > value for v, _, _, m in alone)
    assert bool(note) == faster_rejected
    if note:
        assert note.startswith("faster ") and "rejected: ledger" in note and "GiB" in note


@pytest.mark.parametrize("run_id", ["nemo2407-h100-gpt3-175b-512gpu-fp8", "bridge2511-h100-llama3-70b-64gpu-fp8"])
def test_nvidia_h100_fp8_runs_keep_bf16_gradients_and_fit(run_id):
    # NVIDIA's H100 FP8 configs reduce gradients in bf16 (Bridge grad_reduce_in_fp32 = False; the NeMo launcher's
    # grad_sync_dtype=bf16): the ledger's gradient buffer is 2 bytes per parameter, and the run fits as it trained.
    from autotune.cost.memory import estimate_memory

    run = BY_ID[run_id]
    _, plan, _, mem = predict_run(run)
    assert plan.grad_dtype == "bf16"
    fp32 = estimate_memory(run.model, run.cluster, plan.with_(grad_dtype=None))
    assert mem.gradients == pytest.approx(fp32.gradients / 2)
    assert mem.fits and mem.total < fp32.total


def test_meta_405b_saves_korthikanti_sequence_shards_not_dtensor_gathered_inputs():
    # Llama 3 paper Sec. 3.3.2: Meta's TP is Megatron's with Korthikanti's sequence parallelism; its column-parallel
    # linears keep the sequence shard of their input, so the stage's activations are those of the Megatron facts.
    from autotune.cost.activations import stage_activation_bytes
    from autotune.cost.memory import estimate_memory
    from autotune.engines.facts import MEGATRON_FACTS
    from autotune.specs.settings import MemorySettings

    run = BY_ID["llama3-405b-8k-16384gpu"]
    assert run.memory_overrides.get("linear_inputs_gathered") is False
    plan = run.candidates[0]
    meta = estimate_memory(run.model, run.cluster, plan, MemorySettings(**run.memory_overrides))
    dtensor = estimate_memory(run.model, run.cluster, plan,
                              MemorySettings(**(run.memory_overrides | {"linear_inputs_gathered": None})))
    shard = stage_activation_bytes(run.model, plan, meta.stage, MEGATRON_FACTS)
    assert meta.activation_parts["layers"] == pytest.approx(shard["layers"])
    assert meta.activations < 0.6 * dtensor.activations  # tp8: the QKV and fc1 inputs at 1/8, not whole
    assert (meta.weights, meta.gradients, meta.buffers) == (dtensor.weights, dtensor.gradients, dtensor.buffers)


def test_meta_405b_shards_gradients_every_microbatch_and_frees_stage_buffers():
    # Llama 3 paper Sec. 3.3.2: its FSDP "shards optimizer states and gradients" (no whole-stage fp32 gradient held
    # through the step, as torch.distributed.pipelining holds one) and the stages "proactively deallocate" their
    # inputs and outputs (no per-micro-batch receive buffers). Each setting removes exactly its buffer.
    from autotune.cost.memory import estimate_memory
    from autotune.specs.layout import largest_layer
    from autotune.specs.settings import MemorySettings

    run = BY_ID["llama3-405b-8k-16384gpu"]
    assert run.memory_overrides["grad_accumulation_sharded"] is True
    assert run.memory_overrides["pipeline_buffers_released"] is True
    plan = max(run.candidates, key=lambda p: p.vpp)
    meta = estimate_memory(run.model, run.cluster, plan, MemorySettings(**run.memory_overrides))
    torch_pp = estimate_memory(run.model, run.cluster, plan, MemorySettings(**(run.memory_overrides | {
        "grad_accumulation_sharded": False, "pipeline_buffers_released": False})))
    assert meta.stage == torch_pp.stage
    stage_params = torch_pp.buffer_parts["unsharded_params"] / 2  # bf16 blocks gathered (SHARD_GRAD_OP)
    assert torch_pp.buffer_parts["unsharded_grads"] == pytest.approx(4 * stage_params)  # fp32 accumulator
    assert "unsharded_grads" not in meta.buffer_parts
    assert meta.buffer_parts["unsharded_params"] == torch_pp.buffer_parts["unsharded_params"]
    boundary = 2 * plan.micro_batch_size * plan.seq_len * run.model.hidden_size / plan.tp  # SP shard, bf16
    assert meta.buffer_parts["pipeline_buffers"] == pytest.approx(2 * boundary)  # the two receives in transit
    assert torch_pp.buffer_parts["pipeline_buffers"] > 2 * plan.num_microbatches * plan.vpp * boundary
    assert (meta.weights, meta.gradients, meta.activations) == (
        torch_pp.weights, torch_pp.gradients, torch_pp.activations)
    # Sharded accumulation leaves the buffers of the same sharding without pipelining: under FULL_SHARD the
    # running block's reduce-scatter gradients, not the stage's.
    full = estimate_memory(run.model, run.cluster, plan.with_(zero_stage=3), MemorySettings(**run.memory_overrides))
    layer = largest_layer(run.model).per_gpu(plan.tp, plan.ep)
    assert full.buffer_parts["reduce_scatter_grads"] == pytest.approx(6 * layer)
    assert "unsharded_grads" not in full.buffer_parts


def test_meta_405b_fits_as_it_trained_without_activation_checkpointing():
    # "With these optimizations, we could pre-train Llama 3 on sequences of 8K tokens without activation
    # checkpointing" (Sec. 3.3.2): every candidate of the run fits; the chosen one too, so memory picks nothing.
    from autotune.cost.memory import estimate_memory
    from autotune.specs.settings import MemorySettings

    run = BY_ID["llama3-405b-8k-16384gpu"]
    assert all(p.recompute == "none" for p in run.candidates)
    assert all(estimate_memory(run.model, run.cluster, p, MemorySettings(**run.memory_overrides)).fits
               for p in run.candidates)
    _, plan, _, mem = predict_run(run)
    assert mem.fits and plan_choice_note(run) == ""
