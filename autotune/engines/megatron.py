"""Megatron-LM / Megatron-core: TP (+ SP), PP with uneven first/last stages and interleaving, CP ring, EP,
DDP or the distributed optimizer (zero_stage 1), Megatron-FSDP (zero_stage 2: optim_grads, 3: optim_grads_params;
``autotune.engines.megatron_fsdp``). No offload (DeepSpeed's)."""

from __future__ import annotations

import dataclasses
import functools

from autotune.emit.megatron import architecture_problems, megatron_args
from autotune.emit.megatron_attention import chunked_attention_problem, mla_yarn_gaps
from autotune.emit.megatron_model_flags import router_bias_gap
from autotune.emit.megatron_flags import MEGATRON_CORE_RELEASES
from autotune.emit.megatron_fsdp import sharding_strategy
from autotune.emit.megatron_versions import HEADER
from autotune.emit.megatron_bridge import (
    bridge_files,
    bridge_hydra_args,
    bridge_overrides,
    bridge_model_problems,
    bridge_plan_problems,
    bridge_recipe,
)
from autotune.specs.lora import adapter_params_per_layer, lora_model_problems, trainable_stage_params
from autotune.engines.base import Engine
from autotune.errors import InputError
from autotune.engines.common import shell_array
from autotune.engines.facts import (EAGER_OP_S, MEGATRON_FACTS, ActivationFacts, CommSchedule, EngineFiles,
                                   EngineSupport, Rule)
from autotune.engines.megatron_fsdp import (MEGATRON_FSDP_GRAD_BYTES, lora_fsdp_base_weights, megatron_fsdp_buffers,
                                            megatron_fsdp_rules, megatron_fsdp_states)
from autotune.engines.megatron_rules import (
    activation_offload_rules,
    cp_comm_type_rules,
    cuda_graph_rules,
    fp8_attention_rules,
    ep_overlap_rules,
    expert_bias_rules,
    module_set_rules,
    moe_dispatcher_rules,
    mtp_rules,
    token_drop_rules,
    recompute_module_rules,
)
from autotune.engines.states import megatron_grad_bytes, megatron_states
from autotune.specs.engine_versions import EngineVersions
from autotune.specs.layout import stage_param_groups
from autotune.specs.nvfp4 import is_quantized
from autotune.specs.peft import PEFT_METHODS
from autotune.specs.quantized_gemms import quantized_gemm_groups
from autotune.specs.plan import CP_COMM_TYPES, CUDA_GRAPHS, EP_OVERLAPS, MOE_DISPATCHERS, RECOMPUTE_MODULES

__all__ = ["MegatronEngine"]


@functools.lru_cache(maxsize=None)
def _fp8_attention_facts(fp8_recipe: str) -> ActivationFacts:
    """Megatron's facts with its attention in FP8 under ``fp8_recipe``: one object per recipe (the ledger's caches
    key on the facts' identity)."""
    return dataclasses.replace(MEGATRON_FACTS, fp8_attention_recipe=fp8_recipe)


SEARCHED_MODULE_SETS = (("moe_act",), ("mla_up_proj",), ("moe_act", "layernorm"))
"""The ``--recompute-modules`` sets searched on mixture-of-experts / MLA models beside the default (core_attn), where
the engine's rules accept them (``module_set_rules``: mla_up_proj needs MLA, moe_act an MoE layer), narrowest first:
the planner tries a broader one only where a narrower one does not fit, as Megatron-Bridge@067f987 skills/
nemo-mbridge-perf-activation-recompute/SKILL.md:128-131,168-175 advises from its matched H100 runs (Moonlight-16B:
moe_act freed about what mla_up_proj did at +2.0% against +5.2% step time; layernorm beside moe_act +10.8% and no
further memory; Nemotron-3 Nano: layernorm beside moe freed 1.0 GB more at +3.1%). mla_up_proj is what NVIDIA's
DeepSeek-V3 / Kimi-K2 recipes run (@fcbb6031103d scripts/performance/configs/deepseek/
deepseek_workload_base_configs.py#L104), moe_act + layernorm its GPT-OSS-120B BF16 ones (@c810129341a8 scripts/
performance/configs/gpt_oss/gpt_oss_workload_base_configs.py#L58)."""


class MegatronEngine(Engine):
    name = "megatron"
    title = "Megatron-LM"
    version = "a flag table per release from its megatron/training/arguments.py"
    versions = EngineVersions("megatron-core", "Megatron-core", MEGATRON_CORE_RELEASES)
    support = EngineSupport(tp="megatron", sequence_parallel=True, pp="megatron", vpp=True, layer_split="megatron",
                            tp_with_pp=True, cp="ring", ep=True,
                            # Megatron-FSDP v1 runs with TP, PP and CP (only its v2 refuses them,
                            # megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:627-640)
                            zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1, 2, 3),
                            etp=True, grad_dtypes=("bf16",),
                            # fp4: NVFP4, --fp4-format e2m1 --fp4-recipe nvfp4 (in every modelled release's flag
                            # table, emit/megatron_flags_core_v0.*.json; autotune.specs.nvfp4)
                            precisions=("bf16", "fp16", "fp8", "fp4"),
                            # --fp8-recipe delayed / tensorwise / blockwise / mxfp8 (the choices of every modelled
                            # release's flag table, emit/megatron_flags_core_v0.*.json); --tp-comm-overlap (TE
                            # userbuffers)
                            fp8_recipes=("te-delayed", "te-current", "te-blockwise", "te-mxfp8"),
                            tp_overlaps=("none", "userbuffers"),
                            recompute_modules=RECOMPUTE_MODULES,  # --recompute-modules
                            cuda_graphs=CUDA_GRAPHS,  # --cuda-graph-impl
                            # --overlap-moe-expert-parallel-comm [--delay-wgrad-compute]
                            ep_overlaps=EP_OVERLAPS,
                            # --moe-token-dispatcher-type [--moe-flex-dispatcher-backend]
                            moe_dispatchers=MOE_DISPATCHERS,
                            # Megatron-core's fp8_dot_product_attention: Megatron-Bridge files only (Megatron-LM
                            # has no flag for it: arguments.py:2333 at d98e8a6 keeps it off the command line)
                            fp8_attention=True,
                            # Megatron-core's fp8_output_proj (core_v0.18+, Megatron-LM --fp8-output-proj; NVIDIA/
                            # Megatron-LM 3f6a2ed844): the LM head as a TE linear under the MXFP8 autocast
                            fp8_output_proj=True,
                            token_drop=True,  # --moe-expert-capacity-factor [--moe-pad-expert-input-to-capacity]
                            cp_comm_types=CP_COMM_TYPES,  # --cp-comm-type [--hierarchical-context-parallel-sizes]
                            # Megatron-Bridge's peft=LoRA (its files only: Megatron-LM has no adapters)
                            peft=PEFT_METHODS,
                            # --cpu-offloading-num-layers (transformer_config.py:461, arguments.py:1950-1951)
                            activation_offload=True,
                            # --mtp-num-layers (transformer_config.py:68, MultiTokenPredictionBlock; Megatron-LM
                            # @d98e8a6); Megatron-DeepSpeed and the other engines have no MTP
                            mtp=True,
                            # --pipeline-model-parallel-layout (pipeline_parallel_layer_layout.py) / the
                            # --account-for-*-in-pipeline-split flags: any split, the loss with k slots (loss_slots)
                            loss_slots=True)
    # param_gather: Megatron-FSDP's per-layer gathers under zero_stage 3 (autotune.engines.megatron_fsdp)
    comm = CommSchedule(dp_overlap="bucketed", param_gather="megatron-fsdp", pipeline_schedule="1f1b",
                        # --cp-comm-type's default "p2p" (megatron/training/arguments.py:3221 at d98e8a6):
                        # Transformer Engine's ring attention (autotune/cost/cp_ring.py)
                        cp_kind="p2p",
                        # Transformer Engine DotProductAttention: cuDNN fused attention (FA3-class on Hopper).
                        attention_kernel="fa3", fp8_recipe="te-delayed",
                        # megatron/core/tensor_parallel/layers.py: the dgrad all-reduce / reduce-scatter is
                        # issued async_op=True before the wgrad GEMM (CUDA_DEVICE_MAX_CONNECTIONS=1 orders them).
                        tp_backward_overlap=True,
                        # p2p_communication.py: tensors split across TP ranks for the pipeline send and
                        # gathered on the receiver (the scatter/gather optimisation, Narayanan 2021 Sec. 4.1).
                        pp_scatter_gather=True,
                        # --overlap-p2p-communication: on whenever vpp > 1 (arguments.py; Megatron-Bridge
                        # training/comm_overlap.py:453-463 at 067f987), the steady phase's sends hidden
                        pp_overlap_interleaved=True,
                        # --overlap-param-gather (emitted with --overlap-grad-reduce and the distributed optimizer):
                        # the updated weights' all-gather runs bucket by bucket behind the next forward.
                        param_gather_overlap=True,
                        # cost/launch.py: the host issues each kernel (CUDA graphs issue a captured part at once)
                        kernel_launch_s=EAGER_OP_S)
    checkpoint_format = "torch_dist"
    logged_flops = "megatron-bridge"  # its num_floating_point_operations, logged as "TFLOP/s/GPU"
    # --non-persistent-ckpt-type local + --replication (arguments.py validate_args; nvidia-resiliency-ext)
    checkpoint_tiers = ("shared", "local")
    workload = "command"
    """pretrain_gpt.py needs CUDA: trials of Megatron plans run the user's command (workload ``command``)."""
    sources = {"zero_stage": "megatron/training/arguments.py:3190 (--data-parallel-sharding-strategy)",
               "offload_optimizer": "offload is DeepSpeed's: use engine deepspeed",
               "offload_param": "offload is DeepSpeed's: use engine deepspeed",
               "layer_split": "arguments.py:969 (--decoder-first/last-pipeline-num-layers); "
                              "megatron/core/transformer/transformer_block.py:76 get_num_layers_to_build",
               "loss_slots": "megatron/core/transformer/pipeline_parallel_layer_layout.py (a stage of \"L\" alone); "
                             "autotune/specs/layout.py split_scheme"}

    def searched_recompute_modules(self, model, precision, fp8_recipe):
        recipe = fp8_recipe or self.comm.fp8_recipe
        return tuple(m for m in SEARCHED_MODULE_SETS if not module_set_rules(model, m, precision, recipe))

    def extra_problems(self, model, cluster, plan) -> list[Rule]:
        out = []
        # Megatron-core TransformerConfig: "When using expert parallelism and tensor parallelism,
        # sequence parallelism must be used".
        if plan.ep > 1 and plan.tp > 1 and not plan.sequence_parallel:
            out.append(Rule(id="ep_tp_sp", source="megatron/core/transformer/transformer_config.py",
                            message=f"Megatron-LM: expert parallelism with tp={plan.tp} needs sequence "
                                    f"parallelism: enable it"))
        if plan.peft:
            out += [Rule(id="megatron:peft", source="Megatron-Bridge src/megatron/bridge/peft/lora.py", message=m)
                    for m in lora_model_problems(model)]
        out += [Rule(id="megatron:architecture", message=f"Megatron-LM: {m}",
                     source="megatron/core/models/gpt/gpt_model.py, megatron/core/transformer/transformer_layer.py")
                for m in architecture_problems(model)]
        if chunked := chunked_attention_problem(model, plan.seq_len):
            out.append(Rule(id="megatron:architecture", message=f"Megatron-LM: {chunked}",
                            source="megatron/core/transformer/attention.py:952 at d98e8a6 (attention_chunk 0)"))
        return (out + recompute_module_rules(model, plan, plan.fp8_recipe or self.comm.fp8_recipe)
                + cuda_graph_rules(model, plan) + ep_overlap_rules(model, plan)
                + moe_dispatcher_rules(model, plan, cluster.gpu) + token_drop_rules(model, plan)
                + expert_bias_rules(model, plan)
                + cp_comm_type_rules(model, plan, cluster)
                + megatron_fsdp_rules(model, plan) + activation_offload_rules(model, plan)
                + mtp_rules(model, plan) + fp8_attention_rules(plan, plan.fp8_recipe or self.comm.fp8_recipe))

    def model_states(self, model, plan, stage, dense_params, expert_params):
        import dataclasses

        if plan.peft and model is not None:
            # LoRA: the base weights are frozen (16-bit, no gradient buffer, no optimizer state); the adapters
            # train with Megatron's gradient buffers and (distributed) optimizer (autotune.cost.lora), or with
            # Megatron-FSDP, whose optim_grads_params shards the frozen weights too (lora_fsdp_base_weights).
            adapters = trainable_stage_params(model, plan, self.layer_split_of(plan, model.num_layers), stage)
            if plan.zero_stage >= 2:
                states = megatron_fsdp_states(plan, adapters, 0.0)
                base = lora_fsdp_base_weights(plan, dense_params, expert_params)
            else:
                states = megatron_states(plan, adapters, 0.0)
                base = 2 * (dense_params + expert_params)
            states = dataclasses.replace(states, weights=states.weights + base)
        elif plan.zero_stage >= 2:  # Megatron-FSDP
            states = megatron_fsdp_states(plan, dense_params, expert_params)
        else:
            states = megatron_states(plan, dense_params, expert_params)
        if is_quantized(plan.precision) and self.fp8_param_gather(plan) and model is not None:
            # --fp8-param-gather (emitted with the distributed optimizer): pretrain_gpt.py model_provider builds
            # the model under Transformer Engine's fp8_model_init, whose modules "hold only FP8 copies of its
            # parameters" (TE fp8_model_init docstring): the GEMM weights take 1 byte, not 2; the vocabulary
            # tables are no TE modules and stay 16-bit (autotune.specs.quantized_gemms).
            # Block-scaled recipes keep the scales beside the FP8 data (MXFP8Tensor / Float8BlockwiseQTensor).
            # --fp4-param-gather the same under fp8_model_init with the NVFP4 recipe (Megatron-core fp4_utils.py
            # get_fp4_context ``is_init``): NVFP4 weights of half a byte and their 16 x 16 block scales.
            groups = quantized_gemm_groups(model, plan, stage, stage_param_groups(
                model, plan, stage, self.layer_split_of(plan, model.num_layers)))
            saved = (2 - self.fp8_weight_bytes(plan)) * self._fp8_weights(plan, groups,
                                                                           sharded=plan.zero_stage == 3)
            states = dataclasses.replace(states, weights=states.weights - saved)
        return states

    @staticmethod
    def _fp8_weights(plan, groups, sharded: bool = False) -> float:
        """GEMM weights on this GPU; ``sharded``: Megatron-FSDP's optim_grads_params shard of them."""
        if sharded:
            return (groups.tp_sharded / (plan.tp * plan.zero_partitions)
                    + groups.expert / (plan.ep * plan.expert_tp * plan.expert_zero_partitions))
        return groups.tp_sharded / plan.tp + groups.expert / (plan.ep * plan.expert_tp)

    def fp8_weight_cache_bytes(self, plan, groups, any_layout: bool = False) -> float:
        # With FP8 parameters the weight is itself the row-wise FP8 copy: only the column-wise (transposed) one
        # for the backward GEMMs is cached beside it (TE Float8Tensor's transpose cache; MXFP8 / blockwise tensors
        # hold their column-wise data and scales the same way), none where the weight's one copy serves both
        # (``fp8_copies``: per-tensor scaling on a GPU whose FP8 GEMMs take either layout).
        if plan.zero_stage == 3:
            # Megatron-FSDP frees a unit's FP8 transpose after its backward (--keep-fp8-transpose-cache off,
            # arguments.py:3212; megatron_fsdp.py:630 release_params_fp8_transpose_cache): the gathered units' copies
            # are its unit buffers (buffers)
            return 0.0
        if self.fp8_param_gather(plan):
            return (self.fp8_copies(plan, any_layout) - 1) * self.fp8_weight_bytes(plan) * self._fp8_weights(plan, groups)
        return super().fp8_weight_cache_bytes(plan, groups, any_layout)

    def grad_reduce_bytes(self, plan) -> float:
        return MEGATRON_FSDP_GRAD_BYTES if plan.zero_stage >= 2 else float(megatron_grad_bytes(plan))

    def buffers(self, model, plan, groups, settings, fp8_any_layout=False, stage=0) -> dict[str, float]:
        del stage  # its buffers follow the stage's parameter groups alone
        if plan.zero_stage < 2:
            return {}
        # The unsharded FP8 weights of a unit: the row-wise copy and the column-wise one (MXFP8 gathers each for its
        # pass, param_and_grad_buffer.py:4410-4412; per-tensor scaling makes its transpose beside the gathered data,
        # except on a GPU whose FP8 GEMMs take either layout, where the gathered data serves both: ``fp8_copies``).
        fp8 = is_quantized(plan.precision) and self.fp8_param_gather(plan)  # FP8 or NVFP4 units
        del settings
        gather = self.fp8_copies(plan, fp8_any_layout) * self.fp8_weight_bytes(plan) if fp8 else 2.0
        trains = adapter_params_per_layer(model, plan) if plan.peft else None
        return megatron_fsdp_buffers(model, plan, gather, trains)

    def activation_facts(self, plan):
        # Its MoE experts take the routing probabilities in their activation (facts.py); FP8 attention saves its
        # Q, K, V and output at the recipe's bytes.
        if plan.fp8_attention and plan.precision == "fp8":
            return _fp8_attention_facts(plan.fp8_recipe or self.comm.fp8_recipe)
        return MEGATRON_FACTS

    def saved_states_plan(self, plan):
        # Fully parallel torch_dist save: every tensor once, spread over all ranks as ZeRO-3 would hold it.
        return plan.with_(engine="deepspeed", zero_stage=3, offload_optimizer="none", offload_param="none"), True

    def tag(self, plan) -> str:
        return {0: "mcore-ddp", 1: "mcore-distopt", 2: "mfsdp-optim-grads"}.get(plan.zero_stage,
                                                                                "mfsdp-optim-grads-params")

    def sharding(self, plan) -> str:
        return {0: "plain data parallel: every replica keeps all optimizer states",
                1: "distributed optimizer: optimizer states sharded over the dp x cp ranks",
                2: "Megatron-FSDP optim_grads: gradients and optimizer states sharded over the dp x cp ranks",
                }.get(plan.zero_stage, "Megatron-FSDP optim_grads_params: weights, gradients and optimizer states "
                                       "sharded over the dp x cp ranks; each layer gathered for its forward and "
                                       "again for its backward")

    def release_written(self, options) -> str:
        return options.megatron_version  # the flag table megatron_args.sh is checked against

    def fp8_how(self, plan) -> str:
        return "Megatron-LM flags"

    def fp8_param_gather(self, plan) -> bool:
        # --fp8-param-gather: with the distributed optimizer or Megatron-FSDP (arguments.py:1096-1097)
        return plan.zero_stage >= 1

    def render_files(self, model, cluster, plan, options, checkpoint, env) -> EngineFiles:
        if plan.peft or plan.fp8_attention:
            return self._bridge_only_files(model, cluster, plan, options, checkpoint, env)
        if sharding_strategy(plan):
            # Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1 (arguments.py:1166-1167; Bridge
            # config.py:1110-1112) and only warns about it with TP / CP (arguments.py:1456-1465): leave it unset.
            env = {k: v for k, v in env.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
        argv = megatron_args(model, cluster, plan, options, checkpoint_flags=checkpoint.megatron_flags(),
                             fp8_param_gather=self.fp8_param_gather(plan))
        files = {"megatron_args.sh": shell_array("MEGATRON_ARGS", argv, env,
                                                 HEADER.format(release=options.megatron_version))}
        needs = ["Megatron-LM's pretrain_gpt.py (CUDA) with these arguments; --mock-data unless --data-path is given"]
        if gaps := mla_yarn_gaps(model):  # no flag reaches them: pretrain_gpt.py runs Megatron-core's values
            needs.append(f"megatron_args.sh leaves {model.name}'s YaRN {', '.join(gaps)} at Megatron-core's values "
                         "(no Megatron-LM flag sets them under MLA): set them in the model provider, or use the "
                         "Megatron-Bridge files")
        if gap := router_bias_gap(model):
            needs.append(gap)
        # The same plan for Megatron-Bridge users: overrides of Bridge's recipe (InputError for what it cannot take;
        # a model Bridge has no recipe for and its generic GPT recipe cannot build gets none, and a note).
        unbuildable = bridge_model_problems(model) or bridge_plan_problems(model, plan)
        if unbuildable:
            needs.append("no Megatron-Bridge files: " + "; ".join(unbuildable))
        else:
            files.update(bridge_files(model, cluster, plan, options, checkpoint,
                                      fp8_param_gather=self.fp8_param_gather(plan)))
            needs.append(f"or Megatron-Bridge 0.6: scripts/training/run_recipe.py --recipe {bridge_recipe(model).name} "
                         f"with bridge_overrides.args (bridge_overrides.yaml: the same settings as a config file)")
        entry = (options.launch.script or "pretrain_gpt.py",)
        return EngineFiles(files=files, entry=entry, program_args=argv, env=env, launcher="torchrun",
                           user_script_needs=tuple(needs))

    def _bridge_only_files(self, model, cluster, plan, options, checkpoint, env) -> EngineFiles:
        """A LoRA plan (Megatron-LM has no adapters: pretrain_gpt.py trains every weight) or an FP8-attention plan
        (Megatron-LM has no flag for TransformerConfig.fp8_dot_product_attention: arguments.py:2307-2333 at d98e8a6
        lists it among the fields with no command-line argument): Megatron-Bridge's files alone
        (``autotune.emit.bridge_peft``), launched by its scripts/training/run_recipe.py; InputError where Bridge
        cannot take the plan either."""
        lacks = ("LoRA (its pretrain_gpt.py trains every weight; LoRA runs on Megatron-Bridge)" if plan.peft else
                 "FP8 attention (no command-line flag sets fp8_dot_product_attention; Megatron-Bridge sets it)")
        why = bridge_model_problems(model) or bridge_plan_problems(model, plan)
        if why:
            raise InputError([f"Megatron-LM has no {lacks}, and Megatron-Bridge cannot take this plan: {p}"
                              for p in why], subject="megatron files")
        fp8_param_gather = self.fp8_param_gather(plan)
        files = bridge_files(model, cluster, plan, options, checkpoint, fp8_param_gather=fp8_param_gather)
        overrides = bridge_overrides(model, cluster, plan, options, checkpoint, fp8_param_gather=fp8_param_gather)
        argv = ["--recipe", bridge_recipe(model).name, "--mode", "pretrain", *bridge_hydra_args(overrides)]
        needs = ("Megatron-Bridge 0.6 (a checkout: scripts/training/run_recipe.py) with bridge_overrides.args; no "
                 "megatron_args.sh: Megatron-LM has no " + ("LoRA" if plan.peft else "FP8 attention flag"),)
        return EngineFiles(files=files, entry=(options.launch.script or "scripts/training/run_recipe.py",),
                           program_args=argv, env=env, launcher="torchrun", user_script_needs=needs)
