"""Human-readable tables: the one place where units are formatted."""

from __future__ import annotations

import math

from autotune.cost.cp_ring import cp_kind
from autotune.cost.ep_overlap import EP_A2A_OVERLAP_COST
from autotune.cost.memory import MemoryEstimate
from autotune.engines import engine_for
from autotune.legend import COLUMNS, plan_legend, rejection_legend, wrap
from autotune.specs.hardware import GIB, ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.notation import plan_notation
from autotune.specs.plan import ParallelPlan

__all__ = ["gib", "format_params", "flop_rate", "peak_text", "plan_summary", "memory_table", "step_time_table",
           "stage_times_text", "plan_table", "assumed_settings"]

_BAR_WIDTH = 30


def gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:,.2f}"


def format_params(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


NOMINAL_PEAK_TFLOPS = 1.0
"""Below this a peak is no accelerator's datasheet (the smallest are tens of TFLOP/s): the ``cpu`` preset's
round placeholder (autotune/presets/gpus.yaml), which MFU is then relative to."""


def flop_rate(tflops: float) -> str:
    """A FLOP rate with a unit that keeps its digits: ``989 TFLOP/s``, ``33.9 GFLOP/s`` (a CPU), ``120 MFLOP/s``."""
    for unit, scale in (("TFLOP/s", 1.0), ("GFLOP/s", 1e-3), ("MFLOP/s", 1e-6)):
        if tflops >= scale:
            value = tflops / scale
            return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return f"{tflops * 1e12:,.0f} FLOP/s"


def peak_text(gpu) -> str:
    """A GPUSpec's dense peaks per precision, in units that keep their digits; a CPU's says it is nominal."""
    peaks = ", ".join(f"{k} {flop_rate(v)}" for k, v in gpu.peak_tflops.items())
    if max(gpu.peak_tflops.values()) < NOMINAL_PEAK_TFLOPS:
        return f"{gpu.name}: no datasheet peak; nominal {peaks}"
    return f"peak {peaks}"


def plan_summary(plan: ParallelPlan) -> str:
    """The plan's one-line notation (``autotune.specs.notation``) with its engine's sharding tag."""
    return plan_notation(plan, engine_for(plan).tag(plan))


def _bar(fraction: float) -> str:
    if not math.isfinite(fraction):  # a zero or infinite total upstream: no bar rather than a traceback
        return "?" * _BAR_WIDTH
    filled = max(0, min(_BAR_WIDTH, round(fraction * _BAR_WIDTH)))
    return "#" * filled + "." * (_BAR_WIDTH - filled)


def memory_table(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, memory: MemoryEstimate, *,
                 host_at_save: tuple[float, str] = (0.0, "")) -> str:
    """The ledger as a table in GiB with a percentage bar per term; ``host_at_save``: the host memory a checkpoint
    save adds on a node and what it is (``CheckpointPolicy.host_at_save``), shown as its own host row."""
    title = (f"{model.name} ({format_params(model.num_params)} params) on {cluster.num_gpus} x {cluster.gpu.name}"
             f", seq {plan.seq_len}, global batch {plan.global_batch_size}")
    lines = [title, f"plan: {plan_summary(plan)}  (engine {plan.engine})",
             f"per-GPU memory, pipeline stage {memory.stage} (the most loaded):", ""]
    total = memory.total or 1.0
    lines.append(f"  {'term':<17}{'GiB':>10}{'share':>8}  (share: of the total; capacity row: total / capacity)")
    for name, value in memory.terms().items():
        lines.append(f"  {name.replace('_', ' '):<17}{gib(value):>10}{value / total:>8.1%}  {_bar(value / total)}")
    lines.append(f"  {'total':<17}{gib(memory.total):>10}")
    used = memory.total / memory.capacity if memory.capacity else float("inf")
    lines.append(f"  {'capacity':<17}{gib(memory.capacity):>10}{used:>8.1%}  {_bar(used)} used")
    if memory.host_per_node or memory.nvme_per_node:
        lines.append(f"  host per node    {gib(memory.host_per_node):>10}  of {gib(memory.host_capacity_per_node)} GiB")
    if host_at_save[0]:
        extra, what = host_at_save
        lines.append(f"  host at a save   {gib(memory.host_per_node + extra):>10}  of "
                     f"{gib(memory.host_capacity_per_node)} GiB (+{gib(extra)} GiB {what})")
    if memory.nvme_per_node:
        lines.append(f"  NVMe per node    {gib(memory.nvme_per_node):>10}")
    lines.append("")
    if memory.fits:
        lines.append(f"fits: yes, {gib(memory.headroom)} GiB headroom per GPU")
    else:
        why = []
        if not memory.fits_gpu:
            why.append(f"needs {gib(memory.total)} GiB per GPU, has {gib(memory.capacity)}")
        if not memory.fits_host:
            why.append(f"needs {gib(memory.host_per_node)} GiB host memory per node, has "
                       f"{gib(memory.host_capacity_per_node)}")
        lines.append("fits: NO — " + "; ".join(why))
        if memory.cache_bound:
            lines.append(cache_bound_text(memory))
    return "\n".join(lines)


def cache_bound_text(memory) -> str:
    """What a ledger over the capacity only by the allocator's reserve (``MemoryEstimate.cache_bound``) means, and
    the way out."""
    return (f"  of that, {gib(memory.reserve)} GiB is the caching allocator's reserve (what runs nothing pressed "
            f"held); without it the plan needs {gib(memory.total - memory.reserve)} GiB. With --expandable-segments "
            "(the launch scripts then export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) it fits; without, "
            f"only while fragmentation stays under {gib(memory.capacity - memory.total + memory.reserve)} GiB")


def step_time_table(time, logged_tflops: float | None = None) -> str:
    """The step-time breakdown of one plan (a StepTimeEstimate), seconds and share of the step; ``logged_tflops``:
    what Megatron-Bridge would log for it (``autotune.cost.logged_flops.logged_tflops_per_gpu``), None to leave out."""
    step = time.step_time_s or 1.0
    terms = (("compute", time.compute_s), ("exposed comm", time.exposed_comm_s), ("pipeline bubble", time.bubble_s),
             ("offload", time.offload_s), ("optimizer", time.optimizer_s))
    lines = ["step time per optimizer step (share: of the step):", "",
             f"  {'term':<17}{'s':>10}{'share':>8}"]
    lines += [f"  {name:<17}{value:>10.3f}{value / step:>8.1%}  {_bar(value / step)}" for name, value in terms]
    lines.append(f"  {'step':<17}{time.step_time_s:>10.3f}")
    peak = time.model_tflops_per_gpu / time.mfu if time.mfu > 0 else 0.0
    of_peak = (f"of a nominal {flop_rate(peak)} peak: a CPU has no datasheet peak, so MFU is only as good as the "
               f"preset's placeholder" if 0 < peak < NOMINAL_PEAK_TFLOPS else f"of the {flop_rate(peak)} dense peak")
    lines += ["", f"throughput: {time.tokens_per_s:,.0f} tokens/s; model FLOPs {flop_rate(time.model_tflops_per_gpu)} "
                  f"per GPU", f"MFU {time.mfu:.1%} ({of_peak}), HFU {time.hfu:.1%} (recompute counted)"]
    if logged_tflops is not None:
        lines.append(f"Megatron-Bridge logs {flop_rate(logged_tflops)} per GPU for this step (its own count: "
                     "causal attention as half the s x s square; the model FLOPs above count all of it)")
    if len(time.stage_times_s) > 1:
        lines.append(stage_times_text(time.stage_times_s))
    return "\n".join(lines)


def stage_times_text(stage_times) -> str:
    """The pipeline stages that can be the slowest (``StepTimeEstimate.stage_times_s``) and how far the slowest is
    over the fastest of them: every stage runs at the slowest one's pace. The first stage holds the embedding, the
    last the output layer and the loss."""
    last = max(s for s, _, _ in stage_times)
    extra = {0: " + embedding", last: " + output layer and loss"}
    shown = ", ".join(f"stage {s} ({n} layers{extra.get(s, '')}) {t * 1e3:,.1f} ms" for s, n, t in stage_times)
    slowest = max(stage_times, key=lambda x: x[2])
    fastest = min(t for _, _, t in stage_times)
    return (f"pipeline stages, compute and exposed communication per micro-batch: {shown}; every stage waits for the "
            f"slowest, stage {slowest[0]}: {slowest[2] / fastest - 1:.0%} over the fastest shown")


def plan_table(result) -> str:
    """The planner's top K: plan, memory, step-time split, throughput, MFU; then what pruned the rest."""
    cluster = result.cluster
    lines = [f"{result.model.name} ({format_params(result.model.num_params)} params) on {cluster.num_gpus} x "
             f"{cluster.gpu.name} ({cluster.num_nodes} node{'s' if cluster.num_nodes > 1 else ''} of "
             f"{cluster.gpus_per_node})", ""]
    width = max([48, *(len(plan_summary(est.plan)) + 2 for est in result.candidates)])  # long run-setting words
    header = (f"{'#':>3}  {'engine':<20}{'plan':<{width}}{'mem GiB':>9}{'step s':>9}{'compute':>9}{'comm':>8}{'bubble':>8}"
              f"{'other':>8}{'tokens/s':>12}{'±':>7}{'MFU':>7}")
    lines.append(header)
    for i, est in enumerate(result.candidates, 1):
        t, m = est.time, est.memory
        other = t.offload_s + t.optimizer_s
        tie = "=" if 1 < i <= getattr(result, "tied", 1) else " "  # tied with #1 (autotune.search.ties)
        lines.append(f"{i:>3}{tie} {est.plan.engine:<20}{plan_summary(est.plan):<{width}}{m.total / GIB:>9.1f}"
                     f"{t.step_time_s:>9.2f}{t.compute_s:>9.2f}{t.exposed_comm_s:>8.2f}{t.bubble_s:>8.2f}"
                     f"{other:>8.2f}{t.tokens_per_s:>12,.0f}{est.uncertainty.relative:>7.1%}"
                     f"{t.mfu:>7.1%}")
    lines.append("")
    if result.explanation:
        lines.append("why #1: " + result.explanation)
    if said := release_defaults_line(getattr(result, "release_defaults", None),
                                     getattr(result, "release_cost_settings", None)):
        lines.append(said)
    if (gains := getattr(result, "setting_gains", None)) is not None and (said := gains.text()):
        lines.append(said)
    if (lighter := getattr(result, "last_stage_hint", None)) is not None:
        lines.append(lighter.text().replace("this plan", "#1", 1) + " (`plan --uneven-layouts` searches it)")
    pruned = ", ".join(f"{k} {v:,}" for k, v in result.rejections.items())
    lines.append(f"searched {result.num_enumerated:,} plans in {result.search_time_s:.2f} s: "
                 f"{result.num_feasible:,} feasible; rejected: {pruned or 'none'}")

    lines.append("")
    lines.append(plan_legend(est.plan for est in result.candidates))
    lines.append(wrap("columns: " + "; ".join(f"{name} = {text}" for name, text in COLUMNS.items())))
    if result.rejections:
        lines.append(rejection_legend(result.rejections))
    return "\n".join(lines)


def release_defaults_line(taken: dict | None, cost: dict | None = None) -> str:
    """What a search gave each engine's plans from its release's own defaults (``SearchResult.release_defaults``),
    in flags: ``release defaults: fsdp (torchtitan 0.3) --loss-chunks 8 ...``, and what its release's code was
    estimated to do (``SearchResult.release_cost_settings``: torchtitan 0.3's op-SAC save set); "" when neither."""
    if not taken and not cost:
        return ""
    from autotune.engines import ENGINES

    def named(engine: str, release: str) -> str:
        versions = ENGINES[engine].versions
        return f"{engine} ({versions.label} {versions.shown(release)})"

    parts = []
    for engine, took in (taken or {}).items():
        flags = ", ".join(f"--{name.replace('_', '-')} {value}" + (" (FP8 plans)" if name == "fp8_recipe" else "")
                          for name, value in took["settings"].items())
        parts.append(f"{named(engine, took['release'])}: {flags}")
    code = "; ".join(f"{named(engine, did['release'])}: " + ", ".join(f"{k} {v}" for k, v in did["settings"].items())
                     for engine, did in (cost or {}).items())
    said = ("release defaults, each in its engine's plans only (a flag given wins): " + "; ".join(parts)
            if parts else "")
    if code:
        said += ("; " if said else "") + "estimated as the release's code runs: " + code
    return said + " (--engine-version picks the release)"


def assumed_settings(plan: ParallelPlan, settings, cluster: ClusterSpec | None = None) -> list[str]:
    """The run settings a plan's step time assumed: its engine's defaults (``Engine.comm``, the engine's gradient
    bytes) unless ``settings`` (a TimeSettings) or the plan say otherwise (``autotune.cost.run_settings``, which
    the cost model reads too): what `estimate` names under its table. A setting the plan fixed names its flag.
    ``cluster`` (a ClusterSpec): the launch time as its host issues kernels (``cost.launch.host_issue_s``)."""
    from autotune.cost import run_settings
    from autotune.cost.launch import host_issue_s
    from autotune.specs.lora import lora_run

    engine = engine_for(plan)
    c = engine.comm
    grads = engine.grad_reduce_bytes(plan)

    def asked(name: str, flag: str) -> str:
        return f" ({flag})" if getattr(plan, name) is not None else ""

    out = [f"gradients reduced in {'fp32' if grads >= 4 else '16 bits'}"
           + (" (--grad-dtype bf16)" if plan.grad_dtype == "bf16" else "")]
    if plan.precision == "fp4":
        out.append("NVFP4 (Transformer Engine NVFP4BlockScaling)"
                   + (", NVFP4 weights (--fp4-param-gather)" if engine.fp8_param_gather(plan) else ""))
    if plan.precision == "fp8":
        out.append(f"FP8 recipe {run_settings.fp8_recipe(plan, settings, engine)}"
                   + asked("fp8_recipe", "--fp8-recipe")
                   + (", FP8 weight all-gather" if engine.fp8_param_gather(plan) and plan.zero_stage >= 2 else ""))
    if plan.tp > 1:
        overlap = run_settings.tp_overlap(plan, settings, engine)
        backward = c.tp_backward_overlapped(plan) if settings.tp_backward_overlap is None \
            else settings.tp_backward_overlap
        stated = " (--tp-backward-comm)" if settings.tp_backward_overlap is not None else ""
        out.append(f"TP communication overlap: {overlap}" + asked("tp_overlap", "--tp-overlap")
                   + (", backward input-gradient collective " + ("behind the weight-gradient GEMM" if backward
                                                                 else "waited for") + stated
                      if backward or stated else ""))
    if plan.pp > 1 and plan.vpp > 1:
        sends = c.pp_overlap_interleaved if settings.pp_overlap_interleaved is None else settings.pp_overlap_interleaved
        out.append("interleaved pipeline sends " + ("behind compute in the steady phase" if sends else "waited for")
                   + (" (--pp-sends)" if settings.pp_overlap_interleaved is not None else ""))
    kernel = settings.attention_kernel or c.attention_kernel
    out.append(f"attention kernel {kernel}" + (" (--attention-kernel)" if settings.attention_kernel else "")
               + (" in FP8 (--fp8-attention)" if plan.fp8_attention else "") if plan.flash_attention
               else "attention unfused: the s x s scores materialised (--no-flash-attention)")
    compiled = run_settings.compiled(plan, settings, engine)
    out.append("elementwise kernels " + ("fused by torch.compile" if compiled else c.elementwise_kernels)
               + (" (--compile)" if plan.torch_compile else " (--no-compile)" if plan.torch_compile is False else ""))
    if (plan.loss_chunks or 1) > 1:
        out.append(f"output layer and loss in {plan.loss_chunks} chunks of the sequence (--loss-chunks)")
    te_loss = getattr(settings, "te_cross_entropy", None)  # autotune.cost.loss_kernel
    out.append("loss " + ("Transformer Engine's fused cross entropy (10 HBM bytes a logit)" if te_loss
                          else "an fp32 softmax of the logits (26 HBM bytes a logit)")
               + (" (--cross-entropy)" if te_loss is not None else ""))
    if plan.loss_slots:
        out.append(f"pipeline split: the embedding one layer slot, the output layer and loss {plan.loss_slots} "
                   "(--loss-slots)")
    if plan.fp8_output_proj:
        out.append("output layer in MXFP8 (--fp8-output-proj: Megatron-core fp8_output_proj)")
    if c.kernel_launch_s > 0:
        issue_s = c.kernel_launch_s if cluster is None else host_issue_s(cluster, c.kernel_launch_s)
        host = f" ({issue_s / c.kernel_launch_s:g}x an x86 host's {c.kernel_launch_s * 1e6:g} us: " \
               f"{cluster.gpu.name}'s host)" if issue_s != c.kernel_launch_s else ""
        out.append(f"kernel launches {issue_s * 1e6:.3g} us each{host}, " + (
            "one CUDA graph of the whole forward-backward (--cuda-graph full-iteration)"
            if plan.cuda_graph == "full-iteration" else
            f"CUDA graphs {plan.cuda_graph} over " + (" ".join(plan.cuda_graph_scope) if plan.cuda_graph_scope
                                                     else "each layer") + " (--cuda-graph)"
            if plan.cuda_graph not in (None, "none") else "no CUDA graphs"))
    if plan.ep > 1:
        paired = (f"behind another micro-batch's compute in 1F1B pairs (each second hidden costs it "
                  f"{EP_A2A_OVERLAP_COST:.2f} s, as measured on H100)")
        out.append("MoE all-to-alls " + ({"a2a": paired, "a2a-delay-wgrad": paired + ", weight gradients delayed"}
                                         .get(plan.ep_overlap, "waited for"))
                   + asked("ep_overlap", "--ep-overlap"))
        out.append(f"MoE token dispatcher {plan.moe_dispatcher or 'alltoall'}" + asked("moe_dispatcher",
                                                                                    "--moe-dispatcher"))
    if plan.mtp_layers:
        out.append(f"{plan.mtp_layers} multi-token-prediction module{'s' if plan.mtp_layers > 1 else ''} on the last "
                   "pipeline stage (--mtp-layers)")
    if plan.moe_capacity_factor is not None:
        out.append(f"MoE tokens over {plan.moe_capacity_factor:g} x each expert's balanced share dropped"
                   + (", every expert's input padded to it" if plan.moe_pad_to_capacity else "")
                   + " (--moe-capacity-factor)")
    policy = getattr(settings, "selective_policy", None) or engine.activation_facts(plan).selective
    if plan.recompute == "selective" and policy == "attention-core":
        out.append("selective recompute reruns " + " ".join(run_settings.recompute_modules(plan))
                   + asked("recompute_modules", "--recompute-modules"))
    elif plan.recompute == "selective":
        out.append("selective recompute is torchtitan's op-level SAC: every second mm of a block and its other "
                   "non-attention ops rerun" + (", Float8 GEMM outputs kept (0.3)" if policy == "op-sac-0.3" else ""))
    if plan.world_size > plan.model_parallel_size:
        reduce = "overlapped with backward" if plan.overlap_comm else "after backward"
        out.append(f"data-parallel gradient reduction {reduce}"
                   + ("; updated weights gathered behind the next forward" if c.param_gather_overlap
                      and plan.overlap_comm and plan.zero_stage in (1, 2) else ""))
    if plan.pp > 1:
        out.append(f"pipeline schedule {'interleaved 1F1B' if plan.vpp > 1 else c.pipeline_schedule}")
    if plan.cp > 1:
        kind = cp_kind(plan, c.cp_kind)
        out.append("context parallelism: " + {
            "p2p": "ring attention, K/V passed to the next rank behind each step's kernel (--cp-comm-type p2p)",
            "allgather": "ring attention, K/V all-gathered behind the first step (torch context_parallel's "
                         "rotate method allgather), dK/dV passed ring-wise in fp32",
            "ulysses": "all-to-all of Q, K, V and the output over heads (Ulysses"
                       + (", --cp-comm-type a2a)" if plan.cp_comm_type else ")"),
            "te-allgather": "K/V of the whole sequence all-gathered before attention, dK/dV reduce-scattered after, "
                            "exposed (--cp-comm-type allgather)",
            "a2a+p2p": "all-to-all inside the node, ring attention across nodes (--cp-comm-type a2a+p2p)"}.get(
                kind, str(kind)))
    if (lora := lora_run(plan)) is not None:
        out.append(f"LoRA rank {lora.rank}, alpha {lora.alpha:g} on {' '.join(lora.targets)} (--peft lora): base "
                   "weights frozen (no weight-gradient GEMMs, gradients or optimizer states); adapters trained, "
                   "reduced and stepped")
    return out
