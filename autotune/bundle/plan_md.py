"""plan.md: the plan written for a person: what runs where, why, what it costs, and how to start it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.cost.logged_flops import logged_tflops_per_gpu
from autotune.emit.precision import precision_summary
from autotune.engines import engine_for
from autotune.report import flop_rate, format_params, gib, memory_table, peak_text, plan_summary
from autotune.specs.layout import layer_counts
from autotune.specs.sync_free_moe import RANK_CAPACITY_FACTOR

__all__ = ["plan_markdown", "plan_reasons"]

# What each emitted file is for; launch scripts are the last step, everything else is read or edited first.
_FILE_ROLES: dict[str, str] = {
    "ds_config.json": "DeepSpeed config: the launch scripts pass its path (`\"$SCRIPT_DIR\"/ds_config.json`) to the "
                      "training program",
    "megatron_args.txt": "Megatron-LM arguments, one flag per line",
    "megatron_args.sh": "Megatron-LM arguments as a bash array",
    "megatron_deepspeed_args.sh": "Megatron-DeepSpeed arguments as a bash array",
    "ds_config_hf.json": "DeepSpeed config for the Hugging Face Trainer (its \"auto\" values come from TrainingArguments)",
    "ds_config_accelerate.json": "DeepSpeed config for accelerate (every value concrete), read by accelerate_config.yaml",
    "accelerate_config.yaml": "Accelerate config; its `deepspeed_config_file` is opened from the folder accelerate "
                              "runs in (accelerate 1.16 does not resolve it from the YAML's folder): "
                              "launch_accelerate.sh passes both paths and runs from any folder; by hand, run "
                              "`accelerate launch --config_file accelerate_config.yaml /abs/path/train.py` in this "
                              "folder",
    "accelerate_fsdp.yaml": "Accelerate FSDP2 config (`accelerate launch --config_file <bundle>/accelerate_fsdp.yaml "
                            "train.py`); `fsdp_transformer_layer_cls_to_wrap` must name your model's transformer "
                            "block class (`emit --wrap-class`)",
    "torchtitan_plan.py": "torchtitan 0.3 config module: `plan()` returns the `Trainer.Config` of this plan "
                          "(torchtitan's own recipe for the model, with the plan's parallelism, batch, activation "
                          "checkpointing, compile, Float8 converters and checkpoint settings); with torchtitan 0.3 "
                          "installed, on every node: `PYTHONPATH=<bundle> torchrun --nnodes N --nproc_per_node G "
                          "-m torchtitan.train --module torchtitan_plan --config plan` (the module's docstring has "
                          "the line for this cluster; `--section.key` flags override it)",
    "torchtitan_job.toml": "torchtitan 0.2.x TOML job config (`emit --torchtitan-version 0.2`): in a torchtitan "
                           "0.2.2 checkout, `NGPU=G CONFIG_FILE=<bundle>/torchtitan_job.toml ./run_train.sh`; "
                           "torchtitan 0.3 has no TOML jobs (use torchtitan_plan.py)",
    "plan.json": "the plan and its estimate, machine-readable",
    "te_fp8_recipe.py": "FP8 recipe: `from te_fp8_recipe import fp8_recipe, fp8_autocast` in the training script",
    "hostfile": "DeepSpeed hostfile (`host slots=N`), read by launch_deepspeed.sh",
    ".deepspeed_env": "environment the deepspeed runner exports on every node",
    "plan.md": "this file",
    "resume_fallback.sh": "after losing a node: converts the checkpoint where the format needs it, then starts "
                          "fallback/launch_torchrun.sh (see the fallback plan above)",
}
_LAUNCH_ROLES: dict[str, str] = {
    "launch_torchrun.sh": "`bash launch_torchrun.sh` on every node (torchrun)",
    "launch_deepspeed.sh": "`bash launch_deepspeed.sh` (one node: no ssh; several: on the first node, the deepspeed "
                           "runner starts the rest over ssh)",
    "launch_accelerate.sh": "`bash launch_accelerate.sh` (accelerate launch with accelerate_config.yaml; several nodes: "
                            "on each, with MACHINE_RANK)",
    "launch_slurm.sbatch": "`sbatch launch_slurm.sbatch` (SLURM: srun runs torchrun once per node)",
}
# Engines whose files run the user's checkout of another project's training program, not autotune's trainer.
_PROGRAMS: dict[str, tuple[str, str]] = {
    "megatron": ("Megatron-LM", "https://github.com/NVIDIA/Megatron-LM"),
    "megatron-deepspeed": ("Megatron-DeepSpeed", "https://github.com/deepspeedai/Megatron-DeepSpeed"),
}



def _runs(counts: tuple[int, ...]) -> list[tuple[int, int]]:
    """(value, repeat) runs of a layer-count tuple: (7, 8, 8, 7) -> [(7, 1), (8, 2), (7, 1)]."""
    out: list[tuple[int, int]] = []
    for c in counts:
        if out and out[-1][0] == c:
            out[-1] = (c, out[-1][1] + 1)
        else:
            out.append((c, 1))
    return out

def plan_reasons(estimate) -> list[tuple[str, str, str]]:
    """(dimension, setting, why) for each dimension of the plan, from the model, cluster and plan facts."""
    model, cluster, plan = estimate.model, estimate.cluster, estimate.plan
    rows: list[tuple[str, str, str]] = []
    node = cluster.gpus_per_node
    if plan.tp > 1:
        where = "inside one node (NVLink)" if plan.tp <= node else f"across nodes ({plan.tp} > {node} GPUs per node)"
        rows.append(("tensor parallel", str(plan.tp), f"each layer's matrices split {plan.tp} ways, {where}; "
                     f"{model.num_attention_heads // plan.tp} attention heads per GPU"))
    else:
        rows.append(("tensor parallel", "1", "layers are not split: the per-GPU model states fit without it"))
    counts = layer_counts(model.num_layers, plan.pp, engine_for(plan).layer_split_of(plan, model.num_layers))
    if plan.pp > 1 and counts is not None:
        layers = (f"{counts[0]} layers per stage" if len(set(counts)) == 1
                  else " + ".join(f"{n} x {c}" if n > 1 else str(c) for c, n in _runs(counts)) + " layers")
        bubble = (plan.pp - 1) / (plan.vpp * plan.num_microbatches)
        rows.append(("pipeline parallel", f"{plan.pp}" + (f" x {plan.vpp} virtual" if plan.vpp > 1 else ""),
                     f"{layers}; bubble (pp-1)/(vpp*m) = {plan.pp - 1}/({plan.vpp}*{plan.num_microbatches}) = "
                     f"{bubble:.1%} of the compute"))
    else:
        rows.append(("pipeline parallel", "1", "no pipeline: no bubble"))
    rows.append(("data parallel", str(plan.dp), f"{plan.dp} replicas of the model; the rest of the "
                 f"{cluster.num_gpus} GPUs after tp x pp x cp = {plan.model_parallel_size}"))
    if plan.cp > 1:
        rows.append(("context parallel", str(plan.cp), f"each sequence of {plan.seq_len} tokens split in {plan.cp} "
                     f"({plan.seq_len // plan.cp} per GPU): attention activations shrink by {plan.cp}x"))
    if model.moe is not None:
        rows.append(("expert parallel", str(plan.ep), f"{model.moe.num_experts // plan.ep} of "
                     f"{model.moe.num_experts} experts per GPU (top-{model.moe.top_k} routing, all-to-all)"))
    if plan.tp > 1:
        rows.append(("sequence parallel", "on" if plan.sequence_parallel else "off",
                     "norm and dropout activations split over the TP ranks" if plan.sequence_parallel
                     else "norm and dropout activations replicated on every TP rank"))
    rows.append(("ZeRO / sharding", f"{plan.zero_stage} ({engine_for(plan).tag(plan)})", engine_for(plan).sharding(plan)))
    if plan.offload_optimizer != "none" or plan.offload_param != "none":
        rows.append(("offload", f"optimizer -> {plan.offload_optimizer}, params -> {plan.offload_param}",
                     "model states moved off the GPU; costs host bandwidth every step"))
    rows.append(("micro-batch", f"{plan.micro_batch_size} x {plan.grad_accum_steps} accumulation",
                 f"{plan.micro_batch_size} x {plan.grad_accum_steps} x dp {plan.dp} = global batch "
                 f"{plan.global_batch_size} sequences ({plan.tokens_per_step:,} tokens per step)"))
    recompute = {"none": "all activations kept for backward",
                 "selective": "attention scores recomputed in backward (Korthikanti et al. 2022)",
                 "full": "each layer's input kept, the layer recomputed in backward (about 1/3 more compute)"}
    detail = recompute[plan.recompute]
    if plan.recompute == "full" and plan.recompute_num_layers:
        detail = f"{plan.recompute_num_layers} layers per stage recomputed (block method), the rest kept"
    rows.append(("recompute", plan.recompute, detail))
    engine = engine_for(plan)
    prec = precision_summary(plan, fp8_param_gather=engine.fp8_param_gather(plan), fp8_how=engine.fp8_how(plan),
                             fp8_recipe=plan.fp8_recipe or engine.comm.fp8_recipe)
    why = f"{prec['params_dtype']} weights and activations, fp32 master weights and optimizer states"
    if prec["fp8"]:
        scaling = {"te-delayed": f"delayed scaling over {prec['fp8'].get('amax_history_len')} steps",
                   "te-current": "current (per-tensor) scaling", "torchao-tensorwise": "torchao tensorwise scaling",
                   "torchao-rowwise": "torchao rowwise scaling",
                   "te-blockwise": "blockwise scaling (1x128 blocks, 128x128 for weights; Hopper or later)",
                   "te-mxfp8": "MXFP8 block scaling (32-element blocks, E8M0 scales; Blackwell)",
                   "torchao-mxfp8": "torchao MXFP8 (32-element blocks, E8M0 scales; Blackwell; 16-bit weight "
                                    "all-gather)"}[prec["fp8"]["recipe"]]
        why += (f"; FP8 GEMMs ({prec['fp8']['format']}: {prec['fp8']['forward']} forward, {prec['fp8']['backward']} "
                f"backward, {scaling})")
    if prec.get("fp4"):
        why += ("; NVFP4 GEMMs (E2M1 in 16-value blocks with E4M3 scales, 16x16 blocks for weights; Hadamard "
                "transform of the weight-gradient inputs, stochastic rounding of gradients; attention, norms and "
                "the output layer in bf16; Blackwell)")
    if prec["loss_scaling"]:
        why += "; dynamic loss scaling"
    rows.append(("precision", plan.precision, why))
    rows.append(("attention", "flash" if plan.flash_attention else "unfused",
                 "fused kernel: no s x s score matrices stored" if plan.flash_attention
                 else "scores materialised (s x s per head)"))
    rows.append(("overlap", "on" if plan.overlap_comm else "off",
                 "gradient reduction (and parameter gathers) overlap the backward pass" if plan.overlap_comm
                 else "gradient reduction after the backward pass"))
    if plan.tp_overlap is not None and plan.tp > 1:
        rows.append(("TP overlap", plan.tp_overlap, {
            "none": "TP collectives wait for the GEMMs around them",
            "userbuffers": "TP collectives chunked behind the GEMMs (Megatron --tp-comm-overlap, TE userbuffers)",
            "async-tp": "TP collectives micro-pipelined with the GEMMs (torch async TP, under torch.compile)"}[
                plan.tp_overlap]))
    if plan.torch_compile is not None:
        rows.append(("torch.compile", "on" if plan.torch_compile else "off",
                     "norms, activations and RoPE fused into one kernel each" if plan.torch_compile
                     else "eager: each elementwise op its own kernel"))
    if (plan.loss_chunks or 1) > 1:
        rows.append(("loss chunks", str(plan.loss_chunks), "output layer and loss run chunk by chunk along the "
                     f"sequence, each chunk's backward at once: 1/{plan.loss_chunks} of the fp32 logits live at a time"))
    if plan.cuda_graph is not None:
        rows.append(("CUDA graphs", plan.cuda_graph + (f" ({' '.join(plan.cuda_graph_scope)})" if plan.cuda_graph_scope
                                                       else ""),
                     "no graphs: every kernel launched by the host" if plan.cuda_graph == "none" else
                     "the whole forward-backward replayed as one graph (no host launch time; the input batches "
                     "kept in static buffers)" if plan.cuda_graph == "full-iteration" else
                     "each layer's captured parts launched as one graph (less host launch time, static graph buffers)"))
    if plan.moe_dispatcher is not None:
        rows.append(("MoE dispatcher", plan.moe_dispatcher, {
            "alltoall": "each token sent once per expert it picked (all-to-all)",
            "allgather": "every rank gathers the expert group's tokens, reduce-scatters the outputs back",
            "flex-deepep": "DeepEP: each token sent once per destination GPU, across nodes once per node",
            "flex-hybridep": "HybridEP: each token sent once per destination GPU, across NVLink domains once per "
                             "domain"}[plan.moe_dispatcher]
                     + ("; inside the whole-iteration graph with a static per-rank budget of "
                        f"{RANK_CAPACITY_FACTOR:g} x the routed rows (overflow dropped) and the experts' saved "
                        "tensors in a paged stash" if plan.cuda_graph == "full-iteration"
                        and plan.moe_dispatcher == "flex-hybridep" else "")))
    if plan.moe_capacity_factor is not None:
        rows.append(("MoE capacity", f"{plan.moe_capacity_factor:g}" + (" padded" if plan.moe_pad_to_capacity else ""),
                     "tokens over this multiple of each expert's balanced share are dropped (may change what trains)"
                     + ("; every expert's input padded to it: static shapes, no host sync, the padded rows computed"
                        if plan.moe_pad_to_capacity else "")))
    if plan.cp_comm_type is not None:
        rows.append(("CP exchange", plan.cp_comm_type, {
            "p2p": "K/V passed around the ring of CP ranks, each step behind the previous step's attention kernel",
            "a2a": "Q, K, V all-to-all'ed from sequence to head sharding before attention, the output back after",
            "allgather": "K/V of the whole sequence all-gathered before attention, dK/dV reduce-scattered after",
            "a2a+p2p": "all-to-all among the CP ranks inside a node, the K/V ring across nodes "
                       "(--hierarchical-context-parallel-sizes)"}[plan.cp_comm_type]))
    if plan.ep_overlap is not None:
        rows.append(("EP overlap", plan.ep_overlap, "MoE all-to-alls wait for the experts' input and output"
                     if plan.ep_overlap == "none" else "each MoE layer's dispatch and combine all-to-alls run beside "
                     "another micro-batch's compute in 1F1B pairs (Megatron --overlap-moe-expert-parallel-comm"
                     + (", --delay-wgrad-compute: weight gradients after the data gradients)"
                        if plan.ep_overlap == "a2a-delay-wgrad" else ")")))
    if plan.recompute_modules is not None:
        rows.append(("recompute modules", " ".join(plan.recompute_modules), "what selective recompute reruns in "
                     "backward instead of keeping its activations (Megatron --recompute-modules)"))
    if plan.grad_dtype is not None:
        rows.append(("gradients", plan.grad_dtype, f"accumulated and reduced in {plan.grad_dtype} (half the "
                     "gradient buffer and reduction bytes of fp32 main grads, at bf16's accumulation precision)"))
    return rows


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _time_section(estimate) -> list[str]:
    t = estimate.time
    step = t.step_time_s or 1.0
    parts = [("compute", t.compute_s), ("exposed communication", t.exposed_comm_s), ("pipeline bubble", t.bubble_s),
             ("offload", t.offload_s), ("optimizer step", t.optimizer_s)]
    lines = ["| part | seconds | share |", "|---|---:|---:|"]
    for name, value in parts:
        lines.append(f"| {name} | {value:.3f} | {value / step:.1%} |")
    for kind, value in t.comm_parts_s.items():
        if value:
            lines.append(f"| &nbsp;&nbsp;comm: {kind} | {value:.3f} | {value / step:.1%} |")
    lines.append(f"| **step** | **{t.step_time_s:.3f}** | |")
    lines += ["", f"- throughput: {t.tokens_per_s:,.0f} tokens/s "
                  f"({t.tokens_per_s / estimate.cluster.num_gpus:,.0f} per GPU)",
              f"- model FLOPs: {flop_rate(t.model_tflops_per_gpu)} per GPU, MFU {t.mfu:.1%} "
              f"(hardware, with recompute: {flop_rate(t.hardware_tflops_per_gpu)}, HFU {t.hfu:.1%}; "
              f"{peak_text(estimate.cluster.gpu)})"]
    logged = logged_tflops_per_gpu(estimate.model, estimate.plan, t.tokens_per_s)
    if logged is not None:
        lines.append(f"- Megatron-Bridge logs {flop_rate(logged)} per GPU for this step: its own FLOP count "
                     "(causal attention as half the square), the figure to compare with the job's log")
    return lines


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _measured_section(estimate, measured: Mapping) -> list[str]:
    predicted = {**estimate.time.to_dict(), "peak_memory_bytes": estimate.memory.total}
    lines = ["| quantity | predicted | measured | measured / predicted |", "|---|---:|---:|---:|"]
    for key, value in measured.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            lines.append(f"| {_cell(key)} | | {_cell(value)} | |")
            continue
        pred = predicted.get(key)
        if pred is None and key.startswith("peak") and key.endswith("bytes"):  # not a cut model's "(1 of 4 layers)"
            pred = estimate.memory.total
        fmt = (lambda v: f"{gib(v)} GiB") if "bytes" in key else _number
        ratio = f"{value / pred:.2f}" if isinstance(pred, (int, float)) and pred else ""
        lines.append(f"| {_cell(key)} | {fmt(pred) if isinstance(pred, (int, float)) else ''} | {fmt(value)} | "
                     f"{ratio} |")
    return lines


def _run_section(files: Sequence[str]) -> list[str]:
    if not files:
        return ["(no files were written with this plan)"]
    launch = [f for f in files if f.rsplit("/", 1)[-1] in _LAUNCH_ROLES]
    other = [f for f in files if f not in launch and f.rsplit("/", 1)[-1] != "plan.md"]
    lines, step = [], 1
    if other:
        lines.append(f"{step}. Read and adjust (data paths, tokenizer, checkpoint folder):")
        for f in other:
            role = _FILE_ROLES.get(f.rsplit("/", 1)[-1], "written for this plan")
            lines.append(f"   - `{f}`: {role}")
        step += 1
    if launch:
        lines.append(f"{step}. Start the job with one launcher:")
        for f in launch:
            lines.append(f"   - `{f}`: {_LAUNCH_ROLES[f.rsplit('/', 1)[-1]]}")
        step += 1
    lines.append(f"{step}. Check the first steps against the prediction above (step time, memory); "
                 f"`autotune tune` measures it on the real hardware.")
    return lines


def plan_markdown(estimate, *, checkpoint_policy_text: str = "", measured: Mapping | None = None,
                  files: Sequence[str] = (), user_script_needs: Sequence[str] = (),
                  fallback_lines: Sequence[str] = (), host_at_save: tuple[float, str] = (0.0, ""),
                  trainer_problem: str | None = None) -> str:
    """The plan as Markdown: model and cluster, the plan and why, memory, step time, checkpoints, files;
    ``host_at_save``: the host memory a save adds on a node, and what it is (a row of the ledger);
    ``trainer_problem``: why the launch scripts' built-in trainer cannot run the plan (None: it can, or they run
    the user's script)."""
    model, cluster, plan = estimate.model, estimate.cluster, estimate.plan
    gpu = cluster.gpu
    out = [f"# Training plan: {model.name} on {cluster.num_gpus} x {gpu.name}", "",
           f"`{plan_summary(plan)}` (engine {engine_for(plan).title})", "", "## Model and cluster", ""]
    shape = (f"{model.num_layers} layers, hidden {model.hidden_size}, {model.num_attention_heads} heads"
             + (f" ({model.kv_heads} KV heads)" if model.kv_heads != model.num_attention_heads else "")
             + f", FFN {model.ffn_hidden_size}, vocabulary {model.vocab_size:,}")
    out.append(f"- model: **{model.name}**, {format_params(model.num_params)} parameters"
               + (f" ({format_params(model.num_active_params)} active per token)" if model.moe else "")
               + f"; {shape}")
    if model.moe:
        out.append(f"- mixture of experts: {model.moe.num_experts} experts, top-{model.moe.top_k}, expert FFN "
                   f"{model.moe.expert_ffn_hidden_size}")
    out.append(f"- cluster: {cluster.num_nodes} node(s) x {cluster.gpus_per_node} {gpu.name} ({gpu.memory_gib:g} GiB, "
               f"{peak_text(gpu)}); NVLink {cluster.intra_node_bandwidth_gb_per_s:g} GB/s, network "
               f"{cluster.inter_node_bandwidth_gb_per_s:g} GB/s per GPU")
    out.append(f"- batch: {plan.global_batch_size} sequences x {plan.seq_len} tokens = {plan.tokens_per_step:,} "
               f"tokens per step")
    out += ["", "## The plan and why", "", "| dimension | setting | why |", "|---|---|---|"]
    out += [f"| {_cell(d)} | {_cell(s)} | {_cell(w)} |" for d, s, w in plan_reasons(estimate)]
    out += ["", "## Memory per GPU", "", "```text", memory_table(model, cluster, plan, estimate.memory,
                                                                 host_at_save=host_at_save),
            "```", ""]
    out += ["## Predicted step time", ""] + _time_section(estimate) + [""]
    out += ["## Checkpoint policy", "", checkpoint_policy_text.strip() or "(no checkpoint policy was given)", ""]
    out += list(fallback_lines)
    if measured:
        out += ["## Measured", ""] + _measured_section(estimate, measured) + [""]
    out += ["## How to run", ""] + _run_section(files) + [""]
    if user_script_needs:
        out += _script_section(engine_for(plan), user_script_needs, trainer_problem)
    return "\n".join(out)


def _script_section(engine, user_script_needs: Sequence[str], trainer_problem: str | None = None) -> list[str]:
    """What the launch scripts run for this engine, and what the user's own script must do."""
    if engine.workload == "command":
        project, url = _PROGRAMS.get(engine.name, (engine.title, "the project's repository"))
        lines = ["## The training program", "",
                 f"These files do not run autotune's built-in trainer: the launch scripts run {project}'s "
                 f"`pretrain_gpt.py` with the arguments above. It comes from a {project} checkout "
                 f"(`git clone {url}`). Emitted with `--script /path/to/{project}/pretrain_gpt.py` (a relative path is "
                 f"made absolute when emit reads it), the launch scripts run from any folder; emitted without "
                 f"`--script`, they run `pretrain_gpt.py` relative to the folder they are started in, so start them "
                 f"from the checkout: `cd /path/to/{project} && bash /path/to/this/folder/launch_<launcher>.sh`. "
                 f"It needs:", ""]
    elif trainer_problem:
        configs = [need.split(" is not written", 1)[0] for need in user_script_needs if " is not written" in need]
        lines = ["## Your own training script", "",
                 f"**The built-in trainer cannot run this plan**: {trainer_problem.rstrip('.')}. Emitted without "
                 f"`--script`, the launch scripts run it (`python -m autotune.train --plan plan.json`) and it stops "
                 f"with `UNSUPPORTED` (exit 2). Run it with {engine.title}'s own program from the files above "
                 + (f"(not written for this plan: {', '.join(configs)}, as said below) " if configs else "")
                 + "or with your own script: emit with `--script your_train.py` (a relative path is made absolute "
                 "when emit reads it, so the launch scripts run from any folder), and the launch scripts run it; it "
                 "must:", ""]
    else:
        lines = ["## Your own training script", "",
                 f"Emitted without `--script`, the launch scripts run autotune's built-in trainer (`python -m "
                 f"autotune.train --plan plan.json`), which implements this plan with {engine.title}'s own APIs on "
                 f"a model built from the spec. Emitted with `--script your_train.py` (a relative path is made "
                 f"absolute when emit reads it, so the launch scripts run from any folder), they run your script "
                 f"instead, which must:", ""]
    return lines + [f"- {need}" for need in user_script_needs] + [""]
