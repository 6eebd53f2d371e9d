"""DeepSpeed 0.19.8 on the user's own model: ZeRO 0-3 + offload, AutoTP, PipelineModule, Ulysses.

What it runs and why not the rest:
- ZeRO stages 0-3 with optimizer offload (stages 1-3) and parameter offload (stage 3), CPU or NVMe.
- AutoTP (``"tensor_parallel": {"autotp_size": tp}``, deepspeed/runtime/tensor_parallel/config.py): tp ranks
  share one batch. It does not compose with PipelineModule (DeepSpeed issues #7147, #7730).
- PipelineModule: its own uneven split (``partition_method``, ds_utils.partition_uniform), ZeRO <= 1
  (pipe/engine.py:76 "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"), no interleaving.
- Ulysses sequence parallelism (``sequence_parallel_size``): cp here is Ulysses' degree; attention heads are
  scattered over it (all-to-all), so heads must divide; not with PipelineModule or AutoTP in this version.
- No Megatron-style sequence parallelism (that is Megatron-LM's), no Megatron CP ring.
- No expert parallelism: the files run the user's model as it is, so its experts are not split; ZeRO shards a
  mixture of experts' states like any others. DeepSpeed splits experts inside its own MoE layer
  (``deepspeed.moe.layer.MoE(ep_size=...)``, which Megatron-DeepSpeed builds: engine megatron-deepspeed) or with
  AutoEP (ds_config ``expert_parallel``, DeepSpeed 0.19.8 module_inject/auto_ep.py), which these files do not write:
  on transformers 5.25 its layer replacement stops in ``deepspeed.initialize`` (a TypeError retargeting the
  model's output recorders, auto_ep_presets/base.py:326), so nothing here could check a bundle that uses it.
"""

from __future__ import annotations

from autotune.engines.base import Engine
from autotune.engines.builtin_trainer import deepspeed_trainer_problem
from autotune.engines.common import DS_CONFIG, builtin_or_user_entry, deepspeed_json
from autotune.engines.facts import CommSchedule, EngineFiles, EngineSupport, Rule
from autotune.engines.states import ds_zero12_grad_elements, zero_states
from autotune.specs.engine_versions import EngineVersions
from autotune.specs.layout import largest_layer

__all__ = ["DeepSpeedEngine"]


class DeepSpeedEngine(Engine):
    name = "deepspeed"
    title = "DeepSpeed"
    version = "DeepSpeed 0.19.8"
    versions = EngineVersions("deepspeed", "DeepSpeed", ("0.19",))
    support = EngineSupport(tp="autotp", sequence_parallel=False, pp="deepspeed", vpp=False, layer_split="uniform",
                            tp_with_pp=False, cp="ulysses", ep=False, zero_stages=(0, 1, 2, 3),
                            zero_stages_with_pp=(0, 1), offload_optimizer=("none", "cpu", "nvme"),
                            offload_param=("none", "cpu", "nvme"))
    # DeepSpeed trains the user's PyTorch model (transformers' or their own modules): op by op, no fused kernels.
    comm = CommSchedule(dp_overlap="bucketed", param_gather="prefetch", pipeline_schedule="deepspeed-1f1b",
                        cp_kind="ulysses", elementwise_kernels="eager")
    checkpoint_format = "deepspeed"
    trainer_saves = True
    workload = "builtin"
    trainer_module = "autotune.train.deepspeed"
    trainer_takes_deepspeed_config = True
    uses_deepspeed_ops = True
    sources = {
        "tp_pp": "DeepSpeed issues #7147, #7730: AutoTP inside PipelineModule is not supported",
        "zero_pp": "deepspeed/runtime/pipe/engine.py:76",
        "sequence_parallel": "DeepSpeed has Ulysses (sequence_parallel_size), not Megatron SP",
        "vpp": "deepspeed/runtime/pipe/schedule.py: TrainSchedule is plain 1F1B",
        "layer_split": "deepspeed/runtime/utils.py partition_uniform",
        "ulysses_heads": "deepspeed/sequence/layer.py DistributedAttention (all-to-all over heads)",
        "ep": "these files run the user's model as it is: DeepSpeed splits experts only in its own MoE layer "
              "(deepspeed/moe/layer.py) or with AutoEP (module_inject/auto_ep.py), neither written here: use "
              "engine megatron, fsdp or megatron-deepspeed (DeepSpeed-MoE)",
    }

    def builtin_trainer_problem(self, model, plan) -> str | None:
        return deepspeed_trainer_problem(model, plan)

    def extra_problems(self, model, cluster, plan) -> list[Rule]:
        out = offload_rules(self, plan) + ulysses_rules(self, plan)
        if model.is_moe and plan.tp > 1:
            # Measured here (DeepSpeed 0.19.8, transformers 5.25, 2 CPU ranks, autotp_size 2): a Mixtral and a
            # Qwen3-MoE model keep mlp.experts.gate_up_proj / down_proj whole on each rank while q_proj halves.
            out.append(Rule(id="deepspeed:moe_tp",
                            source="deepspeed/module_inject/auto_tp.py AutoTP._replace (nn.Linear children only); "
                                   "transformers 5 models/mixtral/modeling_mixtral.py:65-66 (MixtralExperts: 3-D "
                                   "nn.Parameter experts)",
                            message=f"tp {plan.tp} on a mixture of experts: DeepSpeed's AutoTP shards nn.Linear layers "
                                    "only, and transformers 5's experts are 3-D parameters (MixtralExperts, "
                                    "Qwen3MoeExperts, GptOssExperts), so every TP rank keeps and runs all experts, "
                                    "which this plan's estimate does not model: use --tp 1 (ZeRO shards the "
                                    "experts), or --engine megatron (expert tensor parallelism)"))
        return out

    def model_states(self, model, plan, stage, dense_params, expert_params):
        elements = None
        if model is not None and plan.zero_stage in (1, 2):
            elements = ds_zero12_grad_elements(model, plan.pp, stage, plan.tp, plan.zero_partitions,
                                               self.support.layer_split)
        return zero_states(plan, dense_params, expert_params, elements)

    def buffers(self, model, plan, groups, settings, fp8_any_layout=False, stage=0) -> dict[str, float]:
        del fp8_any_layout, stage  # none of its buffers depends on the GPU's FP8 GEMM layouts or the stage
        return zero_buffers(model, plan, groups, settings)

    def saved_states_plan(self, plan):
        # ZeRO-3 writes fp32 partitions in the optimizer files; 16-bit weights only via save_16bit_model().
        return plan.with_(offload_optimizer="none", offload_param="none"), plan.zero_stage != 3

    def tag(self, plan) -> str:
        return f"ds-zero{plan.zero_stage}"

    def sharding(self, plan) -> str:
        return ZERO_WORDS[plan.zero_stage]

    def render_files(self, model, cluster, plan, options, checkpoint, env) -> EngineFiles:
        files = {DS_CONFIG: deepspeed_json(self.support, model, cluster, plan, options, checkpoint.ds_checkpoint_block())}
        entry, args = builtin_or_user_entry(options, ["--deepspeed-config", DS_CONFIG],
                                            ["--deepspeed", "--deepspeed_config", DS_CONFIG])
        return EngineFiles(files=files, entry=entry, program_args=args, env=env, launcher="deepspeed",
                           user_script_needs=user_script_needs(plan) + (
                               f"every {checkpoint.interval_steps} steps (the Checkpoint policy) "
                               f"engine.save_checkpoint('{checkpoint.save_dir}', tag=f'step{{step}}') on every rank "
                               "(it writes the 16-bit weights, the ZeRO partitions of the optimizer states and the "
                               f"'latest' tag); resume with engine.load_checkpoint('{checkpoint.save_dir}')",))


ZERO_WORDS = {0: "no sharding: every replica keeps all model states",
              1: "optimizer states (and gradient partitions) sharded over the dp x cp ranks",
              2: "optimizer states and gradients sharded over the dp x cp ranks",
              3: "parameters, gradients and optimizer states sharded; layers gathered just in time"}


def user_script_needs(plan) -> tuple[str, ...]:
    """What the user's own DeepSpeed script must do to run this plan with ds_config.json, as the launch scripts
    call it: ``your_train.py --deepspeed --deepspeed_config <bundle>/ds_config.json`` (then ``script_args``)."""
    out = ["read the command line the launch scripts give it, "
           "`--deepspeed --deepspeed_config <bundle>/ds_config.json` (then your own arguments): "
           "parser = argparse.ArgumentParser(); deepspeed.add_config_arguments(parser); args = parser.parse_args(); "
           "ranks find RANK, LOCAL_RANK and WORLD_SIZE in the environment (no --local_rank argument is passed)",
           "engine, optimizer, _, scheduler = deepspeed.initialize(args=args, model=model, "
           "model_parameters=model.parameters()): ds_config.json (named by args.deepspeed_config) sets the "
           "optimizer, learning-rate schedule, precision, batch sizes and ZeRO stage, so build no optimizer of your "
           "own and feed inputs of the engine's dtype",
           f"each rank reads its own micro-batches of {plan.micro_batch_size} sequences "
           f"(engine.train_micro_batch_size_per_gpu()), e.g. a DistributedSampler or a stream seeded by "
           f"deepspeed.comm.get_rank(); per micro-batch: loss = engine(...); engine.backward(loss); engine.step() "
           f"(the engine steps the optimizer every {plan.grad_accum_steps} micro-batch(es), "
           f"gradient_accumulation_steps)"]
    if plan.tp > 1:
        out.append(f"AutoTP (tensor_parallel.autotp_size={plan.tp}): deepspeed.initialize shards the model itself, "
                   f"from ds_config's tensor_parallel.partition_config if you add one, else from a transformers "
                   f"model's tp_plan, else by DeepSpeed 0.19.8's parser (deepspeed/module_inject/auto_tp.py "
                   f"AutoTP.supported and tp_parser), which needs (1) str(model) to show a class named ...Model or "
                   f"...Stack: the model's own class (class MyModel(nn.Module)) or a child printed as "
                   f"'(name): XModel(', the part before 'Model' not deberta, flaubert, fsmt, gpt2, led, longformer, "
                   f"xlm or xlnet; and (2) the transformer blocks in an nn.ModuleList, each with its output "
                   f"projections as nn.Linear named o_proj, out_proj or down_proj (at any depth in the block; or a "
                   f"Linear just before a LayerNorm): those become row-parallel (all-reduce), every other nn.Linear "
                   f"of the block column-parallel; otherwise it stops with 'Not able to determine model policy "
                   f"automatically. Please provide policy.'. Attention must reshape with the local head count "
                   f"(q.view(b, s, -1, head_dim): each rank holds heads/{plan.tp}); feed every rank of a TP group the "
                   f"same batch (deepspeed.utils.groups.get_data_parallel_rank() picks the data); ds_config.json's "
                   f"train_batch_size is the global batch x {plan.tp}, as DeepSpeed 0.19.8 counts it")
    if plan.pp > 1:
        out.append(f"pp={plan.pp} needs a deepspeed.pipe.PipelineModule as the model given to deepspeed.initialize "
                   f"(a plain nn.Module does not pipeline, and DeepSpeed's batch check then fails): the model as a "
                   f"list of LayerSpec with num_stages={plan.pp}, loss_fn=..., and "
                   f"partition_method='type:<YourBlockClass>' (uneven splits as partition_uniform does them); train "
                   f"with engine.train_batch(data_iter), which runs all {plan.grad_accum_steps} micro-batch(es) of a "
                   f"step, instead of engine.backward / engine.step")
    if plan.cp > 1:
        out.append(f"Ulysses: make the groups with deepspeed.runtime.sequence_parallel.parallel_state_sp"
                   f".initialize_sequence_parallel({plan.cp}) and pass that module as deepspeed.initialize(mpu=...) "
                   f"(ZeRO then reduces over dp x cp), wrap the attention core in "
                   f"deepspeed.sequence.layer.DistributedAttention over its group, feed each rank its seq_len/{plan.cp} "
                   f"shard with RoPE positions offset, and divide each rank's loss by {plan.cp}")
    if plan.recompute == "full":
        out.append("activation checkpointing: wrap each transformer block in deepspeed.checkpointing.checkpoint")
    elif plan.recompute == "selective":  # what the estimate models (autotune.workloads.transformer does the same)
        out.append("selective activation checkpointing: wrap only each block's attention core (softmax(QK^T/sqrt(d)) "
                   "V, not the projections or the MLP) in deepspeed.checkpointing.checkpoint; a whole block wrapped "
                   "is full recompute, slower than the estimate")
    return tuple(out)


def offload_rules(engine: Engine, plan) -> list[Rule]:
    """ZeRO-Offload / ZeRO-Infinity rules (DeepSpeed runtime/zero/config.py, partition_parameters.py)."""
    out = []
    if plan.offload_param != "none" and plan.zero_stage != 3:
        out.append(Rule(id="offload_param_zero3", source="deepspeed/runtime/zero/offload_config.py",
                        message=f"{engine.title}: parameter offload needs ZeRO-3 (got ZeRO-{plan.zero_stage}): "
                                f"set zero_stage=3 or offload_param=none"))
    if plan.offload_optimizer != "none" and plan.zero_stage == 0:
        out.append(Rule(id="offload_optimizer_zero", source="deepspeed/runtime/zero/offload_config.py",
                        message=f"{engine.title}: optimizer offload (ZeRO-Offload) needs ZeRO stage 1, 2 or 3"))
    return out


def ulysses_rules(engine: Engine, plan) -> list[Rule]:
    out = []
    if plan.cp > 1 and (plan.pp > 1 or plan.tp > 1):
        out.append(Rule(id=f"{engine.name}:ulysses_layout", source="deepspeed/sequence/layer.py (Ulysses)",
                        message=f"{engine.title}: Ulysses sequence parallelism (cp={plan.cp}) runs with data "
                                f"parallelism and ZeRO only, not with PipelineModule or AutoTP: set tp=pp=1"))
    return out


def zero_buffers(model, plan, groups, settings) -> dict[str, float]:
    """DeepSpeed's buckets and ZeRO-3 live parameters on one GPU (elements x 2 bytes)."""
    out: dict[str, float] = {}
    psi = groups.per_gpu(plan.tp, plan.ep)
    if plan.zero_stage in (1, 2):
        # Gradients are copied into a reduce bucket before the reduce-scatter; capped by the model size.
        # With overlap_comm two buckets are in flight (one filling, one reducing).
        out["reduce_bucket"] = 2 * min(settings.reduce_bucket_size, psi) * (2 if plan.overlap_comm else 1)
        out["allgather_bucket"] = 2 * min(settings.allgather_bucket_size, psi)
    elif plan.zero_stage == 3:
        out["reduce_bucket"] = 2 * settings.reduce_bucket_size  # allocated eagerly, whatever the model size
        layer = largest_layer(model).per_gpu(plan.tp, plan.ep)
        out["live_parameters"] = 2 * min(settings.stage3_max_live_parameters, 2 * layer)
        out["prefetch_bucket"] = 2 * min(settings.stage3_prefetch_bucket_size, layer)
    return out
