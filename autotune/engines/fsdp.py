"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) and torchtitan: the plan's sharding in PyTorch terms.

zero_stage 3 = FULL_SHARD (``reshard_after_forward=True``), 2 = SHARD_GRAD_OP (``reshard_after_forward=False``),
0 = no sharding (replicate / DDP); there is no optimizer-only sharding (ZeRO-1). ``dp_replicate > 1`` is HSDP
(a replicate x shard mesh). TP is DTensor ``parallelize_module`` (Colwise/Rowwise, SequenceParallel norms),
PP is ``torch.distributed.pipelining`` (1F1B, Interleaved1F1B with vpp > 1; stages split by module names, so
uneven splits are fine), CP is ring attention (``context_parallel``), Float8 via torchao, offload via
``CPUOffloadPolicy`` (parameters, gradients and optimizer states together, FULL_SHARD only).
"""

from __future__ import annotations

from dataclasses import replace

from autotune.emit.options import TORCHTITAN_VERSIONS
from autotune.emit.accelerate import ACCELERATE_RELEASE, DEFAULT_LAYER_CLS, accelerate_fsdp_yaml
from autotune.emit.torchtitan import (TORCHTITAN_FLAVORS, expert_parallel_problem, torchtitan_compiles,
                                     torchtitan_flavor_note, torchtitan_toml)
from autotune.emit.torchtitan_module import MODULE_FILE as TORCHTITAN_MODULE_FILE
from autotune.emit.torchtitan_models import expert_problems_02, model_problems_02, model_problems_03
from autotune.emit.torchtitan_recipes import TORCHTITAN_03_RECIPES
from autotune.emit.torchtitan_module import rope_positions_note, torchtitan_module
from autotune.engines.base import Engine
from autotune.engines.builtin_trainer import fsdp_trainer_problem
from autotune.engines.common import builtin_or_user_entry, optimizer_need
from autotune.engines.facts import ActivationFacts, CommSchedule, EngineFiles, EngineSupport, Rule
from autotune.engines.states import fsdp2_states
from autotune.specs.engine_versions import EngineVersions
from autotune.specs.presets import preset_matching
from autotune.errors import InputError
from autotune.specs.layout import largest_layer, microbatches_in_flight, torchtitan_scheme

__all__ = ["FSDPEngine", "TORCHTITAN_FILE", "TORCHTITAN_MODULE_FILE", "ACCELERATE_FSDP_FILE"]

TORCHTITAN_FILE = "torchtitan_job.toml"
ACCELERATE_FSDP_FILE = "accelerate_fsdp.yaml"

FSDP_WORDS = {0: "no sharding (replicate): every replica keeps fp32 weights, gradients and optimizer states",
              2: "SHARD_GRAD_OP (reshard_after_forward=False): fp32 weights, gradients and optimizer states sharded; "
                 "bf16 weights stay gathered from forward to backward",
              3: "FULL_SHARD (reshard_after_forward=True): everything sharded; each block gathered for its forward "
                 "and again for its backward"}


# FSDPEngine.activation_facts: the same two objects for every plan (a cache key of the ledger's).
_FACTS = ActivationFacts(selective="op-sac", loss_backward_bytes_per_logit=8.0, gathered_linear_inputs=True,
                         fp8_input_bytes=2, moe_expert_outputs_saved=True)
_TP_FACTS = ActivationFacts(selective="op-sac", loss_backward_bytes_per_logit=12.0, gathered_linear_inputs=True,
                            fp8_input_bytes=2, moe_expert_outputs_saved=True)


def _root_params(model, plan, stage: int) -> float:
    """Parameters per GPU of the stage's embedding, final norm and output layer, outside its blocks: all of them
    without pipelining; with it the first stage's embedding and the last stage's norm and output layer (torchtitan
    builds each stage as the model less the others' parts: pipeline_llama.py ``_build_stage`` at 9dec370). None is a
    converted Float8 linear (nn.Embedding is no nn.Linear; torchtitan filters "output": float8.py:99 at 9dec370, the
    ``filter_fqns`` autotune's files write), so they gather in 16 bits whatever the blocks gather in."""
    if plan.pp == 1:
        return (model.embedding_params() + model.output_params()).per_gpu(plan.tp, plan.ep)
    return model.stage_params(0, 0, has_embedding=stage == 0, has_output=stage == plan.pp - 1).per_gpu(
        plan.tp, plan.ep)


class FSDPEngine(Engine):
    name = "fsdp"
    title = "PyTorch FSDP2 / torchtitan"
    accelerate_distributed_type, torchtitan_jobs = "FSDP", True
    version = "torch 2.13 (fully_shard, DTensor, pipelining)"
    versions = EngineVersions("torchtitan", "torchtitan", TORCHTITAN_VERSIONS,
                              companions=(("accelerate", ACCELERATE_RELEASE),))
    """0.3: a Python config module (torchtitan_plan.py); 0.2: the v0.2.x TOML job config."""
    support = EngineSupport(tp="dtensor", sequence_parallel=True, pp="pipelining", vpp=True, layer_split="any",
                            tp_with_pp=True, cp="ring", ep=True, zero_stages=(0, 2, 3), zero_stages_with_pp=(0, 2, 3),
                            offload_optimizer=("none", "cpu"), offload_param=("none", "cpu"), hybrid_shard=True,
                            precisions=("bf16", "fp16", "fp8"),
                            # quantize.linear.float8.recipe_name, quantize.linear.mx (0.3: Float8LinearConverter,
                            # MXFP8LinearConverter); parallelism.enable_async_tensor_parallel; compile
                            fp8_recipes=("torchao-tensorwise", "torchao-rowwise", "torchao-mxfp8"),
                            tp_overlaps=("none", "async-tp"),
                            torch_compile=True, loss_chunks=True,  # torchtitan 0.3 ChunkedLossWrapper
                            # [parallelism] pipeline_parallel_last_stage_less_layers: the output as k layers of
                            # torchtitan's split (layout.torchtitan_split)
                            loss_slots=True)
    comm = CommSchedule(dp_overlap="per_layer", param_gather="fsdp2", pipeline_schedule="1f1b",
                        # torch context_parallel: _cp_options.rotate_method ALL_GATHER, torchtitan
                        # parallelism.context_parallel_rotate_method = "allgather" (config/job_config.py, v0.2.2)
                        cp_kind="allgather",
                        # torch SDPA flash backend (FlashAttention-2); torchtitan Float8: torchao tensorwise with
                        # enable_fsdp_float8_all_gather (torchtitan docs/float8.md); FSDP2 reduce-scatters per
                        # micro-batch by default.
                        attention_kernel="fa2", fp8_recipe="torchao-tensorwise", fp8_param_gather=True,
                        grad_sync_every_microbatch=True,
                        # torchtitan's modules (RMSNorm, FeedForward, apply_rotary_emb) run op by op unless
                        # torch.compile is on (TimeSettings.torch_compile).
                        elementwise_kernels="eager")
    checkpoint_format = "dcp"
    # torchtitan's launcher starts every run with PYTORCH_ALLOC_CONF="expandable_segments:True" (pytorch/torchtitan
    # run_train.sh at 0168bd5; PyTorch reads PYTORCH_ALLOC_CONF and the older PYTORCH_CUDA_ALLOC_CONF alike)
    expandable_segments = True
    trainer_saves = True
    workload = "builtin"
    trainer_module = "autotune.train.fsdp"
    sources = {"zero_stage": "FSDP2 fully_shard has no optimizer-only sharding: use zero_stage 2 or 3",
               "offload_optimizer": "torch.distributed.fsdp.CPUOffloadPolicy",
               "offload_param": "torch.distributed.fsdp.CPUOffloadPolicy",
               "loss_slots": "torchtitan@73a0e69 (v0.2.2) torchtitan/distributed/pipeline_parallel.py:266-296 "
                             "generate_llm_fqn_per_model_part (output_weight = pipeline_parallel_last_stage_less_layers)"}

    def release_problems(self, release, model, plan) -> list[Rule]:
        # The model packages' own refusals (emit.torchtitan_models, the writers' source): torchtitan 0.2.2's Qwen3 and
        # GPT-OSS TrainSpecs have no pipelining; 0.3 has no expert tensor parallelism; neither runs GPT-OSS with CP.
        # They bind plans with expert parallelism only, which torchtitan's MoE packages alone run (fsdp:ep_model):
        # the others the built-in trainer or the user's script runs with torch's own APIs, as plan.md says.
        preset = preset_matching(model, tuple(TORCHTITAN_FLAVORS)) if plan.ep > 1 else None
        if preset is None:
            return []
        if release == "0.2":
            problems = model_problems_02(TORCHTITAN_FLAVORS[preset][0], plan, compiles=self.compiles(plan),
                                         has_03=preset in TORCHTITAN_03_RECIPES)
        elif release == "0.3" and preset in TORCHTITAN_03_RECIPES:
            problems = model_problems_03(TORCHTITAN_03_RECIPES[preset][0], model, plan)
        else:
            return []
        return [Rule(id="fsdp:release", message=f"torchtitan {release} (the only program that runs this plan's expert "
                                               f"parallelism): {p}",
                     source=f"torchtitan {release} (autotune.emit.torchtitan_models)") for p in problems]

    def builtin_trainer_problem(self, model, plan) -> str | None:
        return fsdp_trainer_problem(model, plan, self.layer_split_of(plan, model.num_layers))

    def extra_problems(self, model, cluster, plan) -> list[Rule]:
        out = []
        if plan.offload_param != plan.offload_optimizer or (plan.offload_param != "none" and plan.zero_stage != 3):
            out.append(Rule(id="fsdp:offload", source="torch.distributed.fsdp.CPUOffloadPolicy",
                            message=f"{self.title}: CPUOffloadPolicy offloads parameters, gradients and optimizer states "
                                    "together, under FULL_SHARD: set offload_param = offload_optimizer = cpu with "
                                    "zero_stage 3, or neither"))
        n = plan.num_microbatches
        if plan.pp > 1 and plan.vpp == 1 and n < plan.pp:
            out.append(Rule(id="fsdp:pp_microbatches", source="torch/distributed/pipelining/schedules.py "
                            "Schedule1F1B.__init__",
                            message=f"torch.distributed.pipelining: Number of microbatches ({n}) must be greater "
                                    f"than or equal to the number of stages ({plan.pp}): raise the global batch"))
        if plan.pp > 1 and plan.vpp > 1 and n % max(1, n // plan.pp):
            out.append(Rule(id="fsdp:interleaved_rounds", source="torch/distributed/pipelining/schedules.py "
                            "ScheduleInterleaved1F1B.__init__",
                            message=f"torch.distributed.pipelining: Interleaved 1F1B requires the number of "
                                    f"microbatches ({n}) to be a multiple of the number of rounds "
                                    f"({max(1, n // plan.pp)}): use a multiple of pp micro-batches"))
        # torchtitan borrows the EP ranks from dp_shard x cp x tp (the built-in trainer runs no EP): one source with the
        # TOML writer (emit.torchtitan_models.expert_problems_02); zero 0 shards nothing (dp_shard 1)
        out += [Rule(id="fsdp:ep_mesh", message=f"torchtitan: {problem}",
                     source="torchtitan@73a0e69 (v0.2.2) torchtitan/distributed/parallel_dims.py:136-158; 0.3.0 "
                            "config/configs.py:279-287") for problem in expert_problems_02(model, plan)]
        if problem := expert_parallel_problem(model, plan):
            out.append(Rule(id="fsdp:ep_model", message=problem,
                            source="torchtitan@73a0e69 (v0.2.2) models/deepseek_v3/infra/parallelize.py:126 "
                                   "apply_moe_ep_tp (qwen3 :111, gpt_oss :106, llama4 :140)"))
        if plan.dp_replicate > 1 and plan.zero_stage == 0:
            out.append(Rule(id="fsdp:hybrid_no_shard", source="torch.distributed.fsdp.fully_shard (2-D mesh)",
                            message=f"{self.title}: hybrid sharding (dp_replicate > 1) needs sharding (zero_stage 2 or 3)"))
        return out

    def model_states(self, model, plan, stage, dense_params, expert_params):
        return fsdp2_states(plan, dense_params, expert_params)

    def layer_split_of(self, plan, num_layers: int) -> str:
        return torchtitan_scheme(plan, num_layers)  # torchtitan's own 1F1B split, or the plan's loss slots

    def activation_facts(self, plan):
        # Loss: torchtitan train.py (and autotune.train.fsdp_model) take cross_entropy of ``logits.float()``;
        # with TP torchtitan runs it under DTensor loss_parallel (vocab-sharded logits). Linears: DTensor
        # ColwiseParallel saves its gathered input. Float8: torchao saves the high-precision inputs; so does its MX
        # linear (mx_mm ``ctx.save_for_backward(input_hp, weight_hp)``: torchao v0.16.0 prototype/mx_formats/
        # mx_linear.py:53, v0.18.0 prototype/moe_training/mxfp8_linear.py:108), which re-casts them in backward.
        # Selective recompute: torchtitan's op-level SAC (the emitted TOML's selective_ac_option = "op", and the
        # built-in trainer's apply_ac); torchtitan 0.3's save set through release_cost_settings.
        return _TP_FACTS if plan.tp > 1 else _FACTS

    def fp8_weight_cache_bytes(self, plan, groups, any_layout: bool = False) -> float:
        # torchao float8 casts the weight inside each GEMM's autograd function (dynamic tensorwise scaling):
        # no FP8 copy outlives a layer; with FP8 all-gather the gathered weight is the FP8 one (buffers).
        del plan, groups, any_layout
        return 0.0

    def buffers(self, model, plan, groups, settings, fp8_any_layout=False, stage=0) -> dict[str, float]:
        del fp8_any_layout  # none of its buffers depends on the GPU's FP8 GEMM layouts
        layer = largest_layer(model).per_gpu(plan.tp, plan.ep)
        # Gathered block weights: bf16, or FP8 where torchao's enable_fsdp_float8_all_gather gathers the cast
        # weight (torchao float8/fsdp_utils.py fsdp_pre_all_gather); the root (embedding, norm, output: not
        # converted, torchtitan skips "output") stays bf16.
        block_bytes = 1 if self.fp8_param_gather(plan) else 2
        root = _root_params(model, plan, stage)
        out: dict[str, float] = {}
        if plan.zero_stage == 0:
            # Replicated: fully_shard on a (dp, 1) mesh with reshard_after_forward=False (autotune.train.fsdp_model;
            # torchtitan's fsdp_reshard_after_forward "never"; a plain single-device run under torch.autocast keeps
            # its cached casts the same way): the fp32 weights need no gathering, but the bf16 copies
            # MixedPrecisionPolicy casts them to stay live from each block's forward to its backward, as in
            # SHARD_GRAD_OP. Measured: +7.4 GiB over the fp32 states for phi3-mini (3.82B params: 7.1 GiB in bf16) on
            # one H200 (bench/data/h200_fsdp_trials.json, tests/cost/test_h200_measured.py).
            out["unsharded_params"] = 2 * groups.per_gpu(plan.tp, plan.ep)
            return out | self._pipeline_buffers(model, plan, bool(settings.pipeline_buffers_released))
        if plan.zero_stage == 2:
            # Every block's parameters stay gathered between its forward and backward, and so do the stage's own
            # embedding, norm and output layer (16-bit: _root_params) under pipelining too (torchtitan 9dec370
            # parallelize_llama.py:339 ``reshard_after_forward=not pp_enabled``; v0.2.2 models/llama3/infra/
            # parallelize.py:324-354, the "default" and "never" policies).
            stage_blocks = groups.per_gpu(plan.tp, plan.ep) - root
            out["unsharded_params"] = block_bytes * stage_blocks + 2 * root
        else:
            # FULL_SHARD: the running block and the prefetched next one; the running block's unsharded bf16
            # gradient and its fp32 copy for the reduce-scatter (reduce_dtype fp32). The root group is gathered
            # from the start of backward to its end (the output layer's backward comes first) and, in the torch
            # of torchtitan's published runs (2.6), from forward on (_fsdp_state.py _lazy_init: "For the root,
            # do not reshard after forward").
            # With pipelining (torchtitan's "always" policy) the stage's embedding and output layer reshard after
            # their forward like the blocks; the largest block bounds what they gather.
            out["unsharded_params"] = 2 * block_bytes * layer + (2 * root if plan.pp == 1 else 0.0)
            out["reduce_scatter_grads"] = (2 + 4) * layer
        # With every micro-batch's gradients reduce-scattered into the shards as its backward ends
        # (MemorySettings.grad_accumulation_sharded, Meta's Llama 3 stack), a pipeline stage holds the gradient
        # buffers of the same sharding without pipelining, which reduce-scatters every micro-batch too.
        if plan.pp > 1 and not settings.grad_accumulation_sharded:
            # torch.distributed.pipelining (stage.py backward_maybe_with_nosync) runs every micro-batch's backward
            # with set_requires_gradient_sync(False) and reduce-scatters after the last: the stage's unsharded
            # gradients live through the step, accumulated in reduce_dtype fp32 from the second micro-batch on
            # (_fsdp_param.py to_accumulated_grad_if_needed), bf16 with a single micro-batch.
            out.pop("reduce_scatter_grads", None)
            out["unsharded_grads"] = (4 if plan.num_microbatches > 1 else 2) * groups.per_gpu(plan.tp, plan.ep)
        return out | self._pipeline_buffers(model, plan, bool(settings.pipeline_buffers_released))

    @staticmethod
    def _pipeline_buffers(model, plan, released: bool = False) -> dict[str, float]:
        """torch.distributed.pipelining (stage.py): PipelineStage allocates a receive buffer per micro-batch and
        stage for the input activation and one for the output gradient (``_prepare_forward_infra`` /
        ``_prepare_backward_infra``, ``_make_tensor_from_meta`` per chunk), and keeps each in-flight micro-batch's
        stage output for its backward (``fwd_cache``). One boundary tensor: the bf16 residual stream (SP shard).
        ``released`` (``MemorySettings.pipeline_buffers_released``): a stage that frees its inputs and outputs once
        no later computation reads them holds only the two in transit, the activation received for its next forward
        and the gradient received for its next backward (a kept input is the first layer's saved input, counted with
        the layers' activations)."""
        if plan.pp == 1:
            return {}

        boundary = 2 * plan.micro_batch_size * plan.seq_len / plan.cp * model.hidden_size / (
            plan.tp if plan.sequence_parallel else 1)
        count = 2 if released else 2 * plan.num_microbatches * plan.vpp + microbatches_in_flight(plan, 0)
        return {"pipeline_buffers": count * boundary}

    def optimizer_pass_bytes(self, plan) -> float:
        # The sharded fp32 parameters are the optimizer's own (MixedPrecisionPolicy casts them at the all-gather):
        # no master-to-model copy; the gradient norm, and GradScaler's unscale with fp16.
        return 4.0 + (8.0 if plan.precision == "fp16" else 0.0)

    def compiles(self, plan) -> bool:
        return torchtitan_compiles(plan)  # the torchtitan files' compile.enable

    def release_defaults(self, release: str, model=None) -> dict[str, object]:
        # torchtitan 0.3's recipes (models/*/config_registry.py) compute the loss with ChunkedLossWrapper, 8 chunks
        # (components/loss.py), and its Float8LinearConverter runs rowwise recipes only (components/quantization/
        # float8.py); 0.2.x: unchunked, tensorwise with FP8 all-gather (the modelled defaults). A model with tied
        # embeddings has no torchtitan 0.3 recipe autotune writes: its bundle runs the built-in trainer, which chunks
        # a separate output layer only (autotune.train.fsdp unsupported_reason), so its loss stays whole.
        if release != "0.3":
            return {}
        chunked = {} if model is not None and model.tied_embeddings else {"loss_chunks": 8}
        return chunked | {"fp8_recipe": "torchao-rowwise"}

    def release_cost_settings(self, release: str) -> dict[str, object]:
        # torchtitan 0.3's module selects SelectiveAC (distributed/activation_checkpoint.py), per-op SAC whose save
        # set keeps Float8 GEMM outputs ("op-sac-0.3"); 0.2.x plans are estimated as the built-in trainer runs them.
        return {"selective_policy": "op-sac-0.3"} if release == "0.3" else {}

    def release_written(self, options) -> str:
        return options.torchtitan_version  # 0.3: the config module, 0.2: the TOML (render_files)

    def fp8_param_gather(self, plan) -> bool:
        # torchtitan refuses enable_fsdp_float8_all_gather with a recipe_name (components/quantization/float8.py):
        # only the default tensorwise recipe gathers FP8 weights. MXFP8 gathers 16-bit weights: torchao's MX linear
        # keeps a plain nn.Linear weight and quantises it inside the GEMM's autograd function (torchao v0.16.0
        # prototype/mx_formats/mx_linear.py MXLinear.forward -> mx_mm), and "All distributed communication for MXFP8
        # training is currently done in high precision" (torchtitan v0.2.2 docs/mxfp8.md:179).
        recipe = plan.fp8_recipe or self.comm.fp8_recipe
        return plan.precision == "fp8" and self.comm.fp8_param_gather and recipe == "torchao-tensorwise"

    def grad_reduce_bytes(self, plan) -> float:
        return 4.0  # MixedPrecisionPolicy(reduce_dtype=torch.float32), torchtitan's default

    def saved_states_plan(self, plan):
        # DCP writes every tensor once (replicas deduplicated), spread over the ranks: the FULL_SHARD share.
        return plan.with_(zero_stage=3, dp_replicate=1, offload_optimizer="none", offload_param="none"), True

    def tag(self, plan) -> str:
        base = {0: "fsdp-noshard", 2: "fsdp-grad-op", 3: "fsdp-full"}.get(plan.zero_stage, f"fsdp{plan.zero_stage}")
        return base + (f"-hsdp{plan.dp_replicate}" if plan.dp_replicate > 1 else "")

    def sharding(self, plan) -> str:
        words = FSDP_WORDS.get(plan.zero_stage, "")
        if plan.dp_replicate > 1:
            words += f"; hybrid: sharded within groups of {plan.dp // plan.dp_replicate}, replicated {plan.dp_replicate}x"
        return words

    def fp8_how(self, plan) -> str:
        recipe = plan.fp8_recipe or self.comm.fp8_recipe
        if recipe == "torchao-mxfp8":
            return ("torchao MX linear layers (MXFP8: E4M3 in blocks of 32 with E8M0 scales; torchtitan "
                    "quantize.linear.mx / MXFP8LinearConverter) in place of the block linears")
        return (f"torchao.float8 convert_to_float8_training ({'rowwise' if recipe == 'torchao-rowwise' else 'tensorwise'}"
                " scaling) on the linear layers")

    def render_files(self, model, cluster, plan, options, checkpoint, env) -> EngineFiles:
        entry, args = builtin_or_user_entry(options, [], [])
        # torchtitan's [checkpoint] saves at the policy's interval (the built-in trainer reads checkpoint_policy.json)
        saving = replace(options.checkpoint, interval_steps=checkpoint.interval_steps,
                         async_save=checkpoint.async_save, save_dir=checkpoint.save_dir)
        files, notes = _side_configs(model, cluster, plan, replace(options, checkpoint=saving))
        mp = "torch.float16" if plan.precision == "fp16" else "torch.bfloat16"
        replicate = plan.dp if plan.zero_stage == 0 else plan.dp_replicate
        device = "cpu" if cluster.gpu.name == "cpu" else "cuda"
        needs = [f"one DeviceMesh: torch.distributed.device_mesh.init_device_mesh({device!r}, ({plan.pp}, {replicate}, "
                 f"{plan.dp // replicate}, {plan.tp}), mesh_dim_names=('pp', 'dp_replicate', 'dp_shard', 'tp')) "
                 "(it starts the process group from torchrun's variables"
                 + (", gloo on CPU" if device == "cpu" else ", NCCL; torch.cuda.set_device(LOCAL_RANK) first: a rank "
                    "left on GPU 0 puts its CUDA context there, and at each DCP save its buffers too, +11 GB on GPU 0 "
                    "with 8 GPUs per node in PyTorch issue 151030") + ")",
                 f"fully_shard(block, mesh=mesh[{_dp_dims(replicate)}], reshard_after_forward={plan.zero_stage == 3}, "
                 f"mp_policy=MixedPrecisionPolicy(param_dtype={mp}, reduce_dtype=torch.float32)"
                 + (", offload_policy=CPUOffloadPolicy()" if plan.offload_param == "cpu" else "")
                 + ") on every transformer block, then the same call on the root module; parameters created in "
                 "fp32 (they are the optimizer's master weights), the optimizer built after fully_shard",
                 f"each of the {plan.dp} data-parallel ranks (dp_replicate x dp_shard coordinates) reads its own "
                 "batches; ranks that differ only in their tp or pp coordinate read the same ones; micro-batch "
                 f"{plan.micro_batch_size}, {plan.grad_accum_steps} micro-batch(es) per optimizer step",
                 optimizer_need(options)]
        if plan.recompute == "full":
            needs.append("checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT) on every block "
                         + (f"(the first {plan.recompute_num_layers} of each stage) " if plan.recompute_num_layers
                            else "") + "before fully_shard")
        elif plan.recompute == "selective":
            needs.append("op-level selective activation checkpointing on every block before fully_shard (torchtitan "
                         "selective_ac_option = 'op'): checkpoint_wrapper(block, context_fn=...) with "
                         "create_selective_checkpoint_contexts(policy) saving the outputs of aten.mm (all but every "
                         "second mm of the block), the SDPA kernels, reduce_scatter_tensor and max; gate and up "
                         "projections as two mms")
        if plan.tp > 1:
            needs.append("before fully_shard: parallelize_module(block, mesh['tp'], {q/k/v and fc1 (gate|up, "
                         "interleaved per rank): ColwiseParallel(), o and fc2: RowwiseParallel()}), the embedding "
                         "RowwiseParallel(input_layouts=Replicate()) and the output ColwiseParallel("
                         "output_layouts=Replicate()); attention head counts divided by tp"
                         + ("; SequenceParallel() norms with Shard(1) layouts between blocks"
                            if plan.sequence_parallel else ""))
        if plan.pp > 1:
            needs.append(f"torch.distributed.pipelining: the layers split over pp x vpp = {plan.pp * plan.vpp} "
                         f"stages as plan.json's layout says (stage s on pp rank s % {plan.pp}), one PipelineStage "
                         f"per stage and Schedule{'Interleaved1F1B' if plan.vpp > 1 else '1F1B'}(stages, "
                         f"n_microbatches={plan.num_microbatches}, loss_fn=...); schedule.step(inputs) on the first "
                         "stage, step(target=labels, losses=[]) on the last")
        if plan.ep > 1:
            needs.append(f"expert parallelism (ep {plan.ep}): FSDP2 has none of its own; torchtitan's MoE models run "
                         f"it (apply_moe_ep_tp: each expert on one of {plan.ep} ranks taken from dp_shard x cp x tp, "
                         "tokens sent to their experts and back by all-to-all, the experts sharded by FSDP over the "
                         "remaining ranks): run torchtitan's file, or build the same in your script")
        if plan.cp > 1:
            needs.append(f"context_parallel(mesh['cp'], buffers=[inputs, labels, rope tables], ...) around each "
                         f"forward/backward (cp={plan.cp}; the built-in trainer refuses cp > 1)")
        if ACCELERATE_FSDP_FILE in files:
            wrap = options.launch.wrap_class or DEFAULT_LAYER_CLS
            needs.append(f"or with accelerate (accelerate launch --config_file <bundle>/{ACCELERATE_FSDP_FILE} "
                         f"your_train.py): accelerator.prepare(model, optimizer) does the fully_shard calls on every "
                         f"module of class {wrap} (fsdp_transformer_layer_cls_to_wrap"
                         + (", autotune's built-in model's block" if wrap == DEFAULT_LAYER_CLS else "")
                         + "): emit with --wrap-class YourBlockClass (or edit that line) so it names your model's "
                         "transformer block")
        return EngineFiles(files=files, entry=entry, program_args=args, env=env, launcher="torchrun",
                           user_script_needs=tuple(needs + notes))


def _dp_dims(replicate: int) -> str:
    return "'dp_replicate', 'dp_shard'" if replicate > 1 else "'dp_shard'"


def _side_configs(model, cluster, plan, options) -> tuple[dict[str, str], list[str]]:
    """The torchtitan file of ``options.torchtitan_version`` (0.3: a Python config module, 0.2: the TOML) and
    accelerate's FSDP2 YAML where they can express the plan; else a note why not."""
    files: dict[str, str] = {}
    notes: list[str] = []
    titan = (TORCHTITAN_FILE, torchtitan_toml) if options.torchtitan_version == "0.2" else (
        TORCHTITAN_MODULE_FILE, torchtitan_module)
    for name, render in (titan, (ACCELERATE_FSDP_FILE, accelerate_fsdp_yaml)):
        try:
            files[name] = render(model, cluster, plan, options)
        except InputError as err:
            notes.append(f"{name} is not written: " + "; ".join(err.problems))
    if titan[0] in files and (differs := torchtitan_flavor_note(model)):
        notes.append(differs)
    if TORCHTITAN_MODULE_FILE in files and (longer := rope_positions_note(model, plan)):
        notes.append(longer)
    return files, notes
