"""The plans the Megatron-Bridge tests emit files for, and how they emit them (shared by
test_megatron_bridge_applied.py, which runs Bridge 0.6.2 on the files, and test_megatron_bridge_files.py, which
reads the files themselves)."""

from __future__ import annotations

from dataclasses import replace

from autotune.api import make_plan
from autotune.emit.checkpoint import CheckpointSettings
from autotune.emit.megatron_bridge import bridge_files
from autotune.emit.options import CheckpointOptions, EmitOptions
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset


# (id, model, GPUs, plan)
CASES = [
    ("70b-tp8-pp4-vpp", "llama3-70b", 64, dict(tp=8, pp=4, vpp=2, sequence_parallel=True, zero_stage=1,
                                               global_batch_size=128)),
    ("8b-full-recompute", "llama3-8b", 8, dict(zero_stage=1, global_batch_size=64, recompute="full",
                                                recompute_num_layers=4)),
    ("mixtral-ep", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, zero_stage=1, global_batch_size=128,
                                            recompute="selective")),
    ("8b-fp8", "llama3-8b", 16, dict(tp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                                     precision="fp8")),
    ("70b-uneven-layout", "llama3-70b", 64, dict(tp=4, pp=4, vpp=3, sequence_parallel=True, zero_stage=1,
                                                 global_batch_size=64)),
    ("70b-fp8-ddp", "llama3-70b", 64, dict(tp=8, pp=2, sequence_parallel=True, zero_stage=0, global_batch_size=64,
                                           precision="fp8", recompute="selective")),
    # bf16 gradients (Megatron --grad-reduce-in-bf16), as NVIDIA's benchmark recipes run
    ("70b-bf16-grads", "llama3-70b", 64, dict(tp=8, pp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                                              grad_dtype="bf16")),
    # run settings: TE current scaling (--fp8-recipe tensorwise) and TP userbuffers (--tp-comm-overlap)
    ("70b-fp8-current-userbuffers", "llama3-70b", 64, dict(tp=8, pp=2, sequence_parallel=True, zero_stage=1,
                                                           global_batch_size=64, precision="fp8",
                                                           fp8_recipe="te-current", tp_overlap="userbuffers")),
    # block-scaled recipes: 8B's recipe holds a registered name (bf16_with_fp8_subchannel_scaling_mixed, DDP here;
    # bf16_with_mxfp8_mixed), 70B's takes them field by field (fp8_recipe blockwise / mxfp8)
    *[(f"{m[7:]}-{r[3:]}", m, n, dict(tp=t, pp=p, sequence_parallel=True, zero_stage=z, global_batch_size=64,
                                      precision="fp8", fp8_recipe=r))
      for m, n, t, p, z, r in (("llama3-8b", 16, 2, 1, 0, "te-blockwise"), ("llama3-8b", 16, 2, 1, 1, "te-mxfp8"),
                               ("llama3-70b", 64, 8, 2, 1, "te-blockwise"), ("llama3-70b", 64, 8, 2, 1, "te-mxfp8"))],
    # NVFP4 (Blackwell): 8B's recipe holds a registered name (bf16_with_nvfp4_mixed), 70B's takes the fp4 fields
    ("8b-nvfp4", "llama3-8b", 16, dict(tp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                                       precision="fp4")),
    ("70b-nvfp4", "llama3-70b", 64, dict(tp=8, pp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                                         precision="fp4")),
    # Megatron-core's selective recompute modules (model.recompute_modules)
    ("mixtral-recompute-modules", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, zero_stage=1,
                                                           global_batch_size=128, recompute="selective",
                                                           recompute_modules=("core_attn", "moe_act", "layernorm"))),
    # Transformer Engine CUDA graphs of the attention (model.cuda_graph_impl / cuda_graph_modules)
    ("8b-te-graphs", "llama3-8b", 8, dict(zero_stage=1, global_batch_size=64, cuda_graph="transformer_engine",
                                          cuda_graph_scope=("attn",))),
    # one CUDA graph of the whole forward-backward (model.cuda_graph_impl full_iteration; NaN check off)
    ("8b-full-iteration-graph", "llama3-8b", 8, dict(zero_stage=1, global_batch_size=64, cuda_graph="full-iteration")),
    # the EP all-to-alls behind the other micro-batch's compute (model.overlap_moe_expert_parallel_comm,
    # model.delay_wgrad_compute: the generic recipe has no CommOverlapConfig to overwrite them)
    ("mixtral-ep-overlap", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, zero_stage=1,
                                                    global_batch_size=128, ep_overlap="a2a-delay-wgrad")),
    # the opt-in bundle `autotune plan` names for MoE (autotune.search.setting_gains): a full-iteration graph, the
    # HybridEP dispatcher, the EP overlap with delayed weight gradients and TP userbuffers together, on Blackwell
    # (DeepSeek-V3's recipe has the CommOverlapConfig TP userbuffers need; the generic one Mixtral uses has none)
    ("deepseek-v3-opt-in-bundle", "deepseek-v3", 256, dict(tp=2, ep=64, sequence_parallel=True, zero_stage=1,
                                                           global_batch_size=4096, precision="fp8",
                                                           fp8_recipe="te-mxfp8", mtp_layers=1,
                                                           cuda_graph="full-iteration", moe_dispatcher="flex-hybridep",
                                                           ep_overlap="a2a-delay-wgrad", tp_overlap="userbuffers")),
    # LoRA over the 70B PEFT recipe, as NVIDIA's LoRA benchmark runs it (rank 16, alpha 32, QKV adapters, pp2 vpp20)
    ("70b-lora", "llama3-70b", 8, dict(pp=2, vpp=20, zero_stage=1, global_batch_size=32, peft="lora", lora_rank=16,
                                       lora_alpha=32, lora_targets=("linear_qkv",))),
    # LoRA under Megatron-FSDP optim_grads_params: Bridge applies the adapters before wrapping and its validate()
    # takes both (autotune/engines/megatron_fsdp.py)
    ("70b-lora-mfsdp", "llama3-70b", 8, dict(zero_stage=3, global_batch_size=32, peft="lora", lora_rank=16,
                                             lora_alpha=32, lora_targets=("linear_qkv",))),
    # Megatron-FSDP (ddp.use_megatron_fsdp): optim_grads_params with FP8 parameters, as NVIDIA's Llama-3 70B rows;
    # optim_grads with TP
    ("70b-mfsdp-fp8", "llama3-70b", 64, dict(zero_stage=3, global_batch_size=128, precision="fp8",
                                             fp8_recipe="te-current", recompute="selective")),
    ("8b-mfsdp-optim-grads", "llama3-8b", 8, dict(tp=2, sequence_parallel=True, zero_stage=2, global_batch_size=64)),
    # activation CPU offload of the first 20 layers (model.cpu_offloading_num_layers), as NVIDIA's Llama-3 70B
    # Megatron-FSDP rows on GB300: no recompute, no pipeline (TransformerConfig refuses offload with either)
    ("70b-mfsdp-activation-offload", "llama3-70b", 64, dict(zero_stage=3, global_batch_size=128, precision="fp8",
                                                            fp8_recipe="te-current", recompute="none",
                                                            activation_offload_layers=20)),
    # FP8 attention (mixed_precision.fp8_dot_product_attention, as NVIDIA's MXFP8 Bridge recipes set it): 70B's
    # recipe takes the precision field by field
    ("70b-mxfp8-fp8-attention", "llama3-70b", 64, dict(tp=8, pp=2, sequence_parallel=True, zero_stage=1,
                                                       global_batch_size=64, precision="fp8", fp8_recipe="te-mxfp8",
                                                       fp8_attention=True)),
    # the MXFP8 LM head (model.fp8_output_proj, Megatron-core 0.18+, as NVIDIA's GPT-OSS and DeepSeek-V3 MXFP8 recipes
    # set it): megatron-core 0.19.2's TransformerConfig takes it under the mxfp8 recipe
    ("70b-mxfp8-fp8-head", "llama3-70b", 64, dict(tp=8, pp=2, sequence_parallel=True, zero_stage=1,
                                                  global_batch_size=64, precision="fp8", fp8_recipe="te-mxfp8",
                                                  fp8_output_proj=True)),
    # the output layer and loss as 3 layer slots (ParallelPlan.loss_slots): model.pipeline_model_parallel_layout
    ("70b-loss-slots", "llama3-70b", 64, dict(tp=4, pp=4, vpp=3, sequence_parallel=True, zero_stage=1,
                                              global_batch_size=64, loss_slots=3)),
    # a MoE library recipe whose bridge routes in the model's dtype (Qwen3-MoE's): 128 experts route in fp32; its
    # own TE CUDA graphs are turned off (the plan has none, and Megatron-core refuses them beside full recompute)
    ("qwen3-30b-a3b-library", "qwen3-30b-a3b", 16, dict(ep=8, zero_stage=1, global_batch_size=512,
                                                        recompute="full", recompute_num_layers=48)),
    # the other library recipes (RECIPES), each at its recipe's GPU count, with EP over a TP-1 expert layer (etp 1) as
    # their MoE recipes: Llama 3.1 405B (its RoPE scaling; the recipe's TP-8/CP-2 userbuffers, CP 4 and embedding /
    # loss-accounted split reset), Llama 2 7B, Qwen2.5 72B (QKV biases), Qwen3 8B (a named FP8 precision),
    # Qwen3-235B-A22B (uneven first / last stages), GPT-OSS 20B (quick-GeLU GLU, sinks, sliding windows: CP of 2 by
    # a2a, as its recipe)
    ("llama31-405b-library", "llama3-405b", 256, dict(tp=8, pp=8, vpp=2, sequence_parallel=True, zero_stage=1,
                                                      global_batch_size=512, recompute="selective",
                                                      recompute_modules=("core_attn", "mlp"))),
    ("llama2-7b-library", "llama2-7b", 2, dict(tp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                                               recompute="full", recompute_num_layers=8)),
    ("qwen25-72b-library", "qwen2.5-72b", 32, dict(tp=8, pp=4, sequence_parallel=True, zero_stage=1,
                                                   global_batch_size=128, recompute="selective")),
    ("qwen3-8b-library", "qwen3-8b", 4, dict(tp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                                             precision="fp8", fp8_recipe="te-current")),
    ("qwen3-235b-a22b-library", "qwen3-235b-a22b", 256, dict(tp=4, pp=16, ep=8, etp=1, sequence_parallel=True,
                                                             zero_stage=1, global_batch_size=1024,
                                                             recompute="selective")),
    ("gpt-oss-20b-library-cp", "gpt-oss-20b", 16, dict(tp=2, pp=2, cp=2, cp_comm_type="a2a", ep=4, etp=1,
                                                       sequence_parallel=True, zero_stage=1, global_batch_size=512,
                                                       seq_len=16384)),
    # Kimi-K2 (DeepSeek-V3's architecture under its own config class; the recipe's Muon optimizer and pipeline
    # layout reset) with the EP all-to-all overlap: the shared experts beside the dispatch, which DeepSeek-V3's bridge
    # and Kimi's recipe turn on, are turned off (the plan has none, and Bridge refuses them beside the EP overlap)
    ("kimi-k2-library-ep-overlap", "kimi-k2", 512, dict(tp=4, pp=16, vpp=2, ep=32, etp=1, sequence_parallel=True,
                                                        zero_stage=1, global_batch_size=4096, recompute="selective",
                                                        recompute_modules=("mla_up_proj", "mlp", "moe_act",
                                                                           "layernorm"),
                                                        ep_overlap="a2a-delay-wgrad")),
    # GPT-OSS 120B with the sync-free MoE path under a full-iteration graph (HybridEP's rank budget, the paged stash):
    # its recipe's offload_modules None is Megatron-core's empty list (its paged-stash check iterates it)
    ("gpt-oss-120b-library-full-iteration", "gpt-oss-120b", 64, dict(tp=2, pp=4, ep=16, etp=1,
                                                                     sequence_parallel=True, zero_stage=1,
                                                                     global_batch_size=512,
                                                                     cuda_graph="full-iteration",
                                                                     moe_dispatcher="flex-hybridep")),
    # Q/K norms on the generic recipe (a model no library recipe builds: "PRESET:field=value,..."): Qwen3's per-head
    # RMSNorm (model.qk_layernorm), Llama 4 Scout's weightless one (model.qk_l2_norm)
    ("qwen3-shaped-qk-layernorm", "qwen3-8b:num_layers=30", 8, dict(tp=2, sequence_parallel=True, zero_stage=1,
                                                                    global_batch_size=64)),
    ("llama-shaped-qk-l2-norm", "llama3-8b:qk_norm=l2", 8, dict(zero_stage=1, global_batch_size=64)),
    # Llama 3.1's RoPE scaling (model.rope_scaling, rope_scaling_factor) on a 405B-shaped model of 16 layers, and
    # norms multiplying by (1 + weight) (model.layernorm_zero_centered_gamma)
    ("llama31-shaped-rope-scaling", "llama3-405b:num_layers=16", 8, dict(tp=8, sequence_parallel=True, zero_stage=1,
                                                                        global_batch_size=64)),
    ("llama-shaped-zero-centered-norms", "llama3-8b:norm_zero_centered=true", 8, dict(zero_stage=1,
                                                                                     global_batch_size=64)),
]
PRETRAINED = "/ckpt/llama3-70b-base"
CKPT = CheckpointSettings(save_dir="/ckpt/run1", interval_steps=250, async_save=True)
# The "local" tier: node-local saves with a replica on another node (Megatron's non-persistent local checkpoints).
LOCAL = CheckpointSettings(save_dir="/ckpt/run1", interval_steps=250, async_save=True, local_interval_steps=50,
                           local_dir="/local/ckpt", local_replication_jump=8)


def case_model(model: str):
    """A preset, or "PRESET:field=value,..." for one shaped otherwise (named after the change: no recipe's model)."""
    name, _, changes = model.partition(":")
    m = load_model_preset(name)
    if not changes:
        return m
    words = {"true": True, "false": False}
    fields = {k: int(v) if v.isdigit() else words.get(v, v) for k, v in (c.split("=") for c in changes.split(","))}
    return replace(m, name=f"{name}-{'-'.join(f'{k}{v}' for k, v in fields.items())}", **fields)


def case_plan(model: str, num_gpus: int, kw: dict):
    m = case_model(model)
    blackwell = kw.get("fp8_recipe") == "te-mxfp8" or kw.get("precision") == "fp4"  # MXFP8, NVFP4: Blackwell only
    gpu = "b200" if blackwell else "h100-sxm-80gb"
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus)
    return m, cluster, make_plan(m, cluster, engine="megatron", **{"seq_len": 4096, **kw})


def case_files(m, cluster, plan, ckpt=CKPT, pretrained=PRETRAINED):
    options = EmitOptions(checkpoint=CheckpointOptions(pretrained_dir=pretrained)) if plan.peft else EmitOptions()
    return bridge_files(m, cluster, plan, options, ckpt, fp8_param_gather=plan.zero_stage >= 1)

