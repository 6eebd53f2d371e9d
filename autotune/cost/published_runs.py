"""Both published-runs files (``autotune/data/published_runs``) as plans of the engine each run ran on.

Every run becomes a :class:`PublishedRun`: its family (source group), the model and cluster it ran, the plan
candidates of its engine (one plan, or, where the source leaves a setting out: micro-batch, vpp, the tp x pp split
of a model-parallel size, every valid choice of it; the prediction takes the fastest that fits, as the authors
tuned theirs), the measured tokens/s per GPU and the published peak memory with how it was measured. A run that
cannot be estimated says why (``skipped``); ``bench/accuracy_published.py`` and the golden tests read this.

Field conventions are the files' own (their headers): free-text GPU names, fields with notes ("1 (BF16_Optimizer)"),
``derived:`` arithmetic of the file's authors. Architecture facts a source leaves out come from the public
configuration it names (``autotune.cost.published_facts``), each with its source; nothing here is fitted or
per-run tuned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.kernels import TRITON_FLASH
from autotune.cost.memory import estimate_memory
from autotune.cost.published_fields import (
    family_of,
    lead_int,
    read_cluster,
    read_memory,
    read_model,
    read_parallel,
    read_precision,
    read_recompute,
    read_throughput,
)
from autotune.cost.published_facts import (
    FAMILIES,
    READINGS,
    SAME_CONFIG_AS,
    UNFUSED_ATTENTION,
    reference_dir,
)
from autotune.cost.step_time import TimeSettings, estimate_layer_time, estimate_step_time
from autotune.engines import engine_for
from autotune.rules import plan_problems
from autotune.specs.hardware import GIB, ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.notation import plan_notation
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

__all__ = ["PublishedRun", "published_runs", "run_from_entry", "FAMILIES", "family_of", "predict_run",
           "plan_choice_note"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    run_id: str
    family: str
    source: str
    gpu_text: str
    engine: str
    precision: str
    """The run's precision words ("bf16", "fp8 (torchao tensorwise)")."""
    model: ModelSpec | None = None
    cluster: ClusterSpec | None = None
    candidates: tuple[ParallelPlan, ...] = ()
    time_overrides: dict = field(default_factory=dict)
    memory_overrides: dict = field(default_factory=dict)
    """MemorySettings fields the run's code fixes (torchtitan's op-level selective checkpointing)."""
    """TimeSettings fields the source states (fp8 recipe, TP comm overlap, torch.compile)."""
    tokens_per_s_per_gpu: float | None = None
    peak_memory_gib: float | None = None
    memory_method: str = ""
    """"allocator_reserved" (torch caching allocator, torchtitan) or "nvidia_smi" (device total)."""
    skipped: str = ""
    """Why the run is not estimated (empty: it is)."""
    layer_timing: bool = False
    """The measurement is one layer's forward + backward (Korthikanti Table 4), as tokens/s per GPU of that layer."""


def _splits(p: dict, num_gpus: int, model: ModelSpec) -> list[tuple[int, int, int]]:
    """(tp, pp, cp) choices: the stated ones, or every split of a stated model-parallel size / of nothing."""
    tp, pp, cp = lead_int(p.get("tp")), lead_int(p.get("pp")), lead_int(p.get("cp")) or 1
    mp = lead_int(p.get("model_parallel_size_tp_x_pp"))
    if tp is not None:
        return [(tp, pp or 1, cp)]
    tps = [t for t in (1, 2, 4, 8) if model.num_attention_heads % t == 0]
    if mp is not None:
        return [(t, mp // t, 1) for t in tps if mp % t == 0 and mp // t <= model.num_layers]
    return [(t, q, 1) for t in tps for q in (1, 2, 4, 6, 8, 12, 16) if num_gpus % (t * q) == 0]


def _candidates(entry: dict, model: ModelSpec, cluster: ClusterSpec, engine: str, precision: str
                ) -> tuple[ParallelPlan, ...]:
    p = read_parallel(entry)
    num_gpus = cluster.num_gpus
    rc = read_recompute(p.get("recompute"), model.num_layers)
    if rc is None:
        return ()
    zero = lead_int(p.get("zero_stage"))
    if engine == "fsdp":
        # torchtitan / MPT: FULL_SHARD; Llama 3 "does not reshard after forward" (Herd of Models Sec. 3.3.2).
        # torchtitan's default reshard policy is `reshard_after_forward = not pp_enabled`
        # (torchtitan/models/llama3/infra/parallelize.py): SHARD_GRAD_OP under pipelining.
        zero = 2 if entry["id"].startswith("llama3") or lead_int(p.get("pp", 1)) > 1 else 3
    elif engine == "megatron":
        zero = 1 if entry["id"].startswith(("megatron-core", "nemo", "bridge")) else 0  # distributed optimizer
    elif zero is None:
        zero = 1 if engine == "megatron-deepspeed" else 0
    # 2020-22 software: no fused (flash) attention kernel; Megatron-LM then did not overlap the gradient all-reduce
    # with backprop (Korthikanti Sec. 6.3), nor does DeepSpeed's pipeline engine (it reduces after the last
    # micro-batch, deepspeed/runtime/pipe/engine.py), nor ZeRO-2 at its default overlap_comm false (DeepSpeedExamples
    # Megatron-LM/scripts/ds_zero2_config.json of 2020: "stage": 2 and nothing else); ZeRO-3's gathers are prefetched.
    old = entry["id"].startswith(("narayanan21", "korthikanti22", "bloom", "mtnlg", "palm-mfu-mtnlg", "zero-paper"))
    overlap = not old or engine == "deepspeed"
    # NVIDIA's H100 FP8 performance configs keep and reduce gradients in bf16. Megatron-Bridge v0.2.0 (717c62d, the
    # release documenting the 25.11 container) scripts/performance/configs/llama3/llama3_llm_pretrain.py:46-47
    # (set_llama3_common_configs, called by llama3_70b_h100_config :158-176): ``ddp.grad_reduce_in_fp32 = False``.
    # NeMo 24.07 (NeMo-Framework-Launcher, GPT-3 175B): examples/training/gpt/h100/175b_fp8_16node.sh (edc9045)
    # ``+training.model.optim.grad_sync_dtype=bf16`` for conf/training/gpt3/175b.yaml's distributed_fused_adam with
    # contiguous_grad_buffer, whose buffer is allocated in grad_sync_dtype (apex/contrib/optimizers/
    # distributed_fused_adam.py ``_init_grad_buffer``).
    grad_dtype = "bf16" if entry["id"].startswith(("nemo", "bridge")) else None
    out = []
    for tp, pp, cp in _splits(p, num_gpus, model):
        if num_gpus % (tp * pp * cp):
            continue
        dp = num_gpus // (tp * pp * cp)
        gb = lead_int(p.get("global_batch"))
        for per_rank in ("local_batch", "batch_per_dp_rank_sequences", "micro_batch"):
            if gb is None and lead_int(p.get(per_rank)) is not None:
                gb = lead_int(p[per_rank]) * dp
        if gb is None:
            continue
        mbs = [lead_int(p["micro_batch"])] if lead_int(p.get("micro_batch")) else [1, 2, 4, 8, 16]
        if entry["id"].startswith("torchtitan") and pp > 1 and len(mbs) > 1 and gb % (dp * pp) == 0:
            mbs = [gb // (dp * pp)]  # torchtitan pipeline_llama.py: microbatches = ... or parallel_dims.pp
        elif entry["id"].startswith("torchtitan") and len(mbs) > 1 and lead_int(p.get("local_batch")):
            # torchtitan without PP: training.local_batch_size is each rank's whole batch (global_batch_size
            # defaults to local x dp, so gradient_accumulation_steps = 1).
            mbs = [lead_int(p["local_batch"])]
        vpps = [lead_int(p["vpp"])] if lead_int(p.get("vpp")) else [1, 2, 3, 4, 5, 6, 8]
        if str(p.get("pipeline_schedule", "")).startswith("1F1B"):  # plain 1F1B: no virtual stages
            vpps = [1]
        for mb in mbs:
            if gb % (mb * dp):
                continue
            for vpp in vpps:
                if vpp > 1 and (pp == 1 or engine == "megatron-deepspeed"):
                    continue
                plan = ParallelPlan(
                    tp=tp, pp=pp, cp=cp, vpp=vpp, dp=dp, micro_batch_size=mb, global_batch_size=gb,
                    grad_accum_steps=gb // (mb * dp), seq_len=model.max_position_embeddings, recompute=rc[0],
                    recompute_num_layers=rc[1], engine=engine, zero_stage=zero, precision=precision,
                    sequence_parallel=bool(p.get("sequence_parallel")) or (tp > 1 and not old),
                    flash_attention=not entry["id"].startswith(UNFUSED_ATTENTION), overlap_comm=overlap,
                    grad_dtype=grad_dtype)
                if not plan_problems(model, cluster, plan):
                    out.append(plan)
    return tuple(out)


def _one(entry: dict) -> PublishedRun:
    rid = entry["id"]
    family, engine = family_of(rid)
    src = entry.get("source", {})
    source = f"{src.get('ref', '')}{', ' + str(src['loc']) if src.get('loc') else ''}"
    gpu_text = str(entry.get("hardware", {}).get("gpu", ""))
    precision, words, over = read_precision(entry, family)
    if rid.startswith(("narayanan21", "bloom", "mtnlg", "palm-mfu-mtnlg", "zero-paper")):
        # The 2021-22 code these ran reduced the TP input gradient synchronously in backward (Megatron-LM v2's
        # mpu/mappings.py; the bigscience Megatron-DeepSpeed fork's megatron/mpu/layers.py has no async_op
        # all-reduce); the async dgrad all-reduce behind the wgrad GEMM came with Megatron-LM's
        # LinearWithGradAccumulationAndAsyncCommunication (used by Korthikanti 2022).
        over["tp_backward_overlap"] = False
    if rid.startswith(("narayanan21", "korthikanti22")):
        # Megatron-LM's interleaved schedule waited for every send until overlap_p2p_comm (Megatron-LM f9283c5a8a,
        # 2023-05-31 "Add option to overlap p2p communication"; the default from 4eeff55d1f, 2023-10-12).
        over["pp_overlap_interleaved"] = False
    if rid.startswith("narayanan21-t2-zero3"):
        # DeepSpeed of 2021 (v0.3.x): ZeRO-3 gathers and reduce-scatters through per-rank tensor lists
        # (autotune.cost.zero3_gathers); the coalesced collectives came in v0.5.5 (#1188) and v0.6.0 (#1453).
        over["zero3_list_collectives"] = True
    if rid.startswith("mpt-"):
        # llm-foundry's MPT benchmark tables (b2a43a147) ran attn_impl 'triton' (submit_benchmarks.py:144 default;
        # the yamls' attn_config): FlashAttention in pre-MLIR Triton (autotune.cost.kernels.TRITON_FLASH).
        over["attention_kernel"] = TRITON_FLASH
    if rid.startswith(("nemo", "bridge")):
        # NeMo / Megatron-Bridge H100 performance recipes turn on TP comm overlap with userbuffers
        # (Megatron-Bridge scripts/performance: COMM_OVERLAP_CONFIG_MAP["llama3_70b"]["h100"]["fp8"] =
        # userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192; NeMo's gpt3_175b recipe: userbuffers_*_h12288_tp4).
        over["tp_overlap"] = "userbuffers"
    # torchtitan train_configs (llama3_*.toml at the doc's commit): selective_ac_option = 'op', for memory and time.
    # The model code of those runs repeats K and V to every query head before SDPA (torchtitan 9dec370, the H100
    # doc's "Versions used": torchtitan/models/llama/model.py Attention.forward, repeat_kv), so context
    # parallelism exchanges and holds them at the query width (autotune.cost.cp_ring).
    sac = {"selective_policy": "op-sac", "cp_repeat_kv": True} if family.startswith("torchtitan") else {}
    memory = dict(sac)
    if rid.startswith("llama3"):
        # Meta's own 4D-parallel stack, not torchtitan: its tensor parallelism is Megatron's with Korthikanti's
        # sequence parallelism (Llama 3 paper, arXiv 2407.21783, Sec. 3.3.2: "tensor parallelism (TP; Krizhevsky et
        # al. (2012); Shoeybi et al. (2019); Korthikanti et al. (2023))"), whose column-parallel linears keep only the
        # sequence shard of their input for backward (Korthikanti Sec. 4.2.2), not DTensor's gathered one.
        memory["linear_inputs_gathered"] = False
        # Its FSDP "shards optimizer states and gradients" (Sec. 3.3.2), accumulating gradients "in FP32 ... over
        # multiple micro-batches" and reduce-scattering them "in FP32" ("Numerical stability"): no unsharded
        # whole-stage gradient through the step, unlike torch.distributed.pipelining's. And "we proactively
        # deallocate tensors that will not be used for future computation, including the input and output tensors of
        # each pipeline stage" (Sec. 3.3.2, pipeline parallelism improvements): no per-micro-batch stage buffers.
        memory["grad_accumulation_sharded"] = True
        memory["pipeline_buffers_released"] = True
    base = {"run_id": rid, "family": family, "source": source, "gpu_text": gpu_text, "engine": engine,
            "precision": words, "time_overrides": over | sac, "memory_overrides": memory}
    layer_ms = None
    if entry.get("measured", {}).get("scope") == "per_layer":
        # Korthikanti Table 4 times "one transformer layer of the 22B model" (Table 3: 48 layers; vocabulary
        # 51200 as in every GPT run of the paper); compared like with like: the model's one-layer forward + backward.
        layer_ms = entry["measured"]["fwd_plus_bwd_ms"]
        entry = {**entry, "model": {"layers": 48, "vocab": 51200, **entry["model"]}}
    if engine == "none":
        return PublishedRun(**base, skipped="a TPU run (JAX/TF): no engine here trains on TPUs")
    model = read_model(entry, family)
    if model is None:
        m = entry.get("model", {})
        why = (f"a headline over models of {m['params_b']}B parameters" if "-" in str(m.get("params_b", ""))
               else f"only {m.get('params_b')}B parameters")
        return PublishedRun(**base, skipped=f"the source gives no single model configuration: {why}, no "
                                            "layers/hidden/heads nor parallel layout in the entry")
    cluster, why = read_cluster(gpu_text, entry)
    if cluster is None:
        return PublishedRun(**base, model=model, skipped=why)
    peak, method = read_memory(entry)
    sixteen = cluster.gpu.peak_tflops.get("bf16") or cluster.gpu.peak_tflops.get("fp16", 0.0)
    tps = read_throughput(entry, model, cluster.num_gpus, sixteen)
    if layer_ms is not None:
        tps = lead_int(entry["parallel"]["micro_batch"]) * model.max_position_embeddings / (layer_ms / 1e3) \
            / cluster.num_gpus
    cands = _candidates(entry, model, cluster, engine, precision)
    skipped = "" if cands else "no plan of its engine expresses the stated configuration"
    if not cands and lead_int(read_parallel(entry).get("global_batch")) is None \
            and "local_batch" not in entry.get("parallel", {}):
        skipped = "global batch not stated (and no per-rank batch to derive it)"
    return PublishedRun(**base, model=model, cluster=cluster, candidates=cands, tokens_per_s_per_gpu=tps,
                        peak_memory_gib=peak, memory_method=method, skipped=skipped, layer_timing=layer_ms is not None)


def run_from_entry(entry: dict) -> PublishedRun:
    """The run one entry of the published-runs YAML's form describes (a row held out of the run set, e.g.
    ``bench/mpt_long_sequence.py``'s), read as :func:`published_runs` reads the set's."""
    return _one(entry)


def published_runs(folder: Path | None = None) -> list[PublishedRun]:
    """Every run of published_runs_dev.yaml and published_runs_more.yaml, in file order."""
    folder = folder or reference_dir()
    out = []
    for name in ("published_runs_dev.yaml", "published_runs_more.yaml"):
        data = yaml.safe_load((folder / name).read_text(encoding="utf-8"))
        by_id = {e["id"]: e for e in data["runs"]}
        for entry in data["runs"]:
            twin = by_id.get(SAME_CONFIG_AS.get(entry["id"], ""))
            if twin is not None:
                parallel = {k: v for k, v in twin["parallel"].items() if k not in ("recompute", "sequence_parallel")}
                entry = {**entry, "parallel": {**parallel, **entry["parallel"]}}
            reading = READINGS.get(entry["id"], {})
            entry = {**entry, **{k: {**entry.get(k, {}), **v} if isinstance(v, dict) else v
                                 for k, v in reading.items()}}
            out.append(_one(entry))
    return out


def _scored_candidates(run: PublishedRun, eff=None) -> list:
    """(fits, tokens/s per GPU, plan, StepTimeEstimate, MemoryEstimate) of every candidate of ``run``."""
    settings = TimeSettings(efficiency=eff or DEFAULT_EFFICIENCY, **run.time_overrides)
    out = []
    for plan in run.candidates:
        mem = estimate_memory(run.model, run.cluster, plan, MemorySettings(**run.memory_overrides))
        est = estimate_step_time(run.model, run.cluster, plan, settings)
        out.append((mem.fits, est.tokens_per_s / plan.world_size, plan, est, mem))
    return out


def predict_run(run: PublishedRun, eff=None):
    """(predicted tokens/s per GPU, plan, StepTimeEstimate, MemoryEstimate) for the fastest candidate that fits
    (or the fastest, if none fits: the run fitted, so the ledger is then too high; :func:`plan_choice_note`)."""
    assert run.cluster is not None and run.model is not None and run.candidates
    if run.layer_timing:
        settings = TimeSettings(efficiency=eff or DEFAULT_EFFICIENCY, **run.time_overrides)
        plan = run.candidates[0]
        layer_s = sum(estimate_layer_time(run.model, run.cluster, plan, settings))
        est = estimate_step_time(run.model, run.cluster, plan, settings)
        mem = estimate_memory(run.model, run.cluster, plan)
        return plan.micro_batch_size * plan.seq_len / layer_s / plan.world_size, plan, est, mem
    _, value, plan, est, mem = max(_scored_candidates(run, eff), key=lambda c: (c[0], c[1]))
    return value, plan, est, mem


def plan_choice_note(run: PublishedRun, eff=None) -> str:
    """Where the ledger, not the source, decided the plan: the chosen plan over capacity (no candidate fits), or
    faster candidates rejected because the ledger says they do not fit. Empty when memory changed nothing."""
    if run.layer_timing or not run.candidates:
        return ""
    scored = _scored_candidates(run, eff)
    fits, value, plan, _, mem = max(scored, key=lambda c: (c[0], c[1]))
    if not fits:
        return (f"ledger over capacity: {mem.total / GIB:.1f} of {mem.capacity / GIB:.1f} GiB, no candidate fits "
                "(the run trained: the ledger is high)")
    faster = sorted((c for c in scored if not c[0] and c[1] > value), key=lambda c: -c[1])
    if not faster:
        return ""
    _, v, p, _, m = faster[0]
    more = f" (+{len(faster) - 1} more)" if len(faster) > 1 else ""
    return (f"faster {plan_notation(p, engine_for(p).tag(p))} ({v / value - 1:+.1%}) rejected: ledger "
            f"{m.total / GIB:.1f} of {m.capacity / GIB:.1f} GiB{more}")
