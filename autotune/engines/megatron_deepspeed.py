"""Megatron-DeepSpeed (BLOOM, MT-NLG): Megatron TP (+ SP) inside DeepSpeed's PipelineModule, whose
``partition_method='type:transformer'`` splits layers uniformly (uneven where they do not divide: BLOOM's
70 layers on 12 stages), ZeRO-1 (BF16_Optimizer with bf16) over dp; ZeRO-2/3 only without a pipeline;
DeepSpeed Ulysses (``--ds-sequence-parallel-size``) as its sequence parallelism."""

from __future__ import annotations

import json

from autotune.emit.megatron import deepspeed_moe_problems, layer_norms_problem, megatron_deepspeed_args
from autotune.emit.megatron_deepspeed_model import SOURCE as MODEL_SOURCE
from autotune.emit.megatron_deepspeed_model import megatron_deepspeed_model_problems
from autotune.engines.base import Engine
from autotune.engines.common import DS_CONFIG, engine_deepspeed_config, shell_array
from autotune.engines.deepspeed import ZERO_WORDS, offload_rules, ulysses_rules, zero_buffers
from autotune.engines.facts import CommSchedule, EngineFiles, EngineSupport, Rule
from autotune.engines.states import bf16_optimizer_states, zero_states
from autotune.specs.engine_versions import EngineVersions

__all__ = ["MegatronDeepSpeedEngine"]

MOE_SOURCES = {"moe_form": "microsoft/Megatron-DeepSpeed megatron/model/transformer.py ParallelTransformerLayer "
                           "(MoE(ParallelMLP(...)) per --expert-interval)",
               "moe_zero3": 'deepspeed 0.19.8 runtime/engine.py:2214-2216: "Native DeepSpeed MoE is not supported with '
                            'ZeRO Stage 3"'}
"""Where each of ``emit.megatron.deepspeed_moe_problems``' refusals comes from."""


def _bf16_optimizer(plan) -> bool:
    """DeepSpeed steps a bf16 (or fp8 outside TE) plan at ZeRO 0-1 with its BF16_Optimizer, unless the optimizer is
    offloaded: then its ZeRO optimizer (deepspeed 0.19.8 runtime/engine.py:2305-2308, ``not zero_cpu_offload()``)."""
    return plan.precision != "fp16" and plan.zero_stage <= 1 and plan.offload_optimizer == "none"


class MegatronDeepSpeedEngine(Engine):
    name = "megatron-deepspeed"
    title = "Megatron-DeepSpeed"
    version = "Megatron-DeepSpeed (microsoft, 2024) on DeepSpeed 0.19.8"
    versions = EngineVersions("deepspeed", "DeepSpeed", ("0.19",))
    """Megatron-DeepSpeed has no releases on PyPI: the DeepSpeed under it is the version that counts."""
    support = EngineSupport(tp="megatron", sequence_parallel=True, pp="deepspeed", vpp=False, layer_split="uniform",
                            tp_with_pp=True, cp="ulysses", ep=True, zero_stages=(0, 1, 2, 3),
                            zero_stages_with_pp=(0, 1),
                            # DeepSpeed's ZeRO-Offload / -Infinity from the ds_config, with the fork's --cpu-optimizer
                            # (DeepSpeedCPUAdam, megatron/optimizer/__init__.py:83-94 at 4efb479d) and --remote-device
                            # (zero.Init, pretrain_gpt.py:46-50): the DeepSpeed engine's rules and costs (offload_rules)
                            offload_optimizer=("none", "cpu", "nvme"), offload_param=("none", "cpu", "nvme"))
    comm = CommSchedule(dp_overlap="bucketed", param_gather="prefetch", pipeline_schedule="deepspeed-1f1b",
                        cp_kind="ulysses",
                        # The fork's layers.py overlaps the input gradient's all-reduce with the wgrad GEMM only
                        # with async_tensor_model_parallel_allreduce, which validate_args turns off under
                        # --deepspeed (megatron/arguments.py:396-399 at 4efb479d): the backward of
                        # copy_to_tensor_model_parallel_region all-reduces, waited for; a sequence-parallel plan's
                        # reduce-scatter is issued async_op=True before the wgrad GEMM (layers.py:348-356).
                        tp_backward_overlap="sequence-parallel")
    checkpoint_format = "deepspeed"
    workload = "command"
    uses_deepspeed_ops = True
    sources = {"zero_pp": "deepspeed/runtime/pipe/engine.py:76",
               "vpp": "DeepSpeed's PipelineEngine TrainSchedule has no interleaving",
               "layer_split": "megatron/model/gpt_model.py GPTModelPipe partition_method='type:transformer'"}

    def extra_problems(self, model, cluster, plan) -> list[Rule]:
        # Ulysses composes with Megatron TP here
        out = [r for r in ulysses_rules(self, plan) if plan.pp > 1] + offload_rules(self, plan)
        out += [Rule(id=f"megatron-deepspeed:{kind}", message=f"Megatron-DeepSpeed: {message}",
                     source=MOE_SOURCES[kind]) for kind, message in deepspeed_moe_problems(model, plan).items()]
        # The layer norms only, not ALiBi or an embedding norm, which the writer also refuses (microsoft's fork):
        # the published BLOOM runs are the BigScience fork's, estimated as this engine.
        norms = layer_norms_problem(model)
        if norms:
            out.append(Rule(id="megatron-deepspeed:layer_norms", message=f"Megatron-DeepSpeed: {norms}",
                            source="microsoft/Megatron-DeepSpeed megatron/model/transformer.py ParallelTransformerLayer"))
        unbuilt = megatron_deepspeed_model_problems(model, plan.seq_len)
        if unbuilt:  # one rule, its source once, however many features the fork lacks
            out.append(Rule(id="megatron-deepspeed:architecture", message="Megatron-DeepSpeed: " + "; ".join(unbuilt),
                            source=MODEL_SOURCE))
        return out

    def model_states(self, model, plan, stage, dense_params, expert_params):
        if _bf16_optimizer(plan):  # bf16 (and fp8 outside TE) use BF16_Optimizer
            return bf16_optimizer_states(plan, dense_params, expert_params)
        return zero_states(plan, dense_params, expert_params)

    def buffers(self, model, plan, groups, settings, fp8_any_layout=False, stage=0) -> dict[str, float]:
        del fp8_any_layout, stage  # none of its buffers depends on the GPU's FP8 GEMM layouts or the stage
        offloaded = plan.offload_optimizer != "none"  # ZeRO-1's offload runs stage_1_and_2's buckets
        return zero_buffers(model, plan, groups, settings) if plan.zero_stage >= 2 or offloaded else {}

    def grad_reduce_bytes(self, plan) -> float:
        return 4.0 if _bf16_optimizer(plan) else 2.0  # BF16_Optimizer reduces its fp32 accumulators

    def grad_accumulate_bytes(self, plan) -> float:
        # deepspeed/runtime/pipe/engine.py _exec_backward_pass: with bf16, every micro-batch's backward ends with
        # BF16_Optimizer.update_hp_grads (hp_grad.add_(lp.grad.to(fp32))): read 2 B + read 4 B + write 4 B.
        return 10.0 if _bf16_optimizer(plan) else 0.0

    def saved_states_plan(self, plan):
        return plan.with_(offload_optimizer="none", offload_param="none"), plan.zero_stage != 3

    def tag(self, plan) -> str:
        return "mds-bf16opt" if _bf16_optimizer(plan) else f"mds-zero{plan.zero_stage}"

    def sharding(self, plan) -> str:
        return ZERO_WORDS[plan.zero_stage]

    def render_files(self, model, cluster, plan, options, checkpoint, env) -> EngineFiles:
        argv = megatron_deepspeed_args(model, cluster, plan, options, DS_CONFIG)
        config = engine_deepspeed_config(self.support, model, cluster, plan, options,
                                         checkpoint_block=checkpoint.ds_checkpoint_block())
        if model.is_moe and plan.pp > 1 and plan.tp > 1:
            # The MoE layers pass their aggregated loss between stages beside the activation, and DeepSpeed's
            # pipeline partitions only the first of the tensors it sends: deepspeed 0.19.8 runtime/pipe/engine.py:736
            # asserts the others need no grad while pipe_partitioned is on (its default with tp > 1: runtime/
            # config.py:279-280), and the fork refuses either partitioning for MoE with pp and tp > 1
            # (megatron/model/gpt_model.py:376-384 @f4157bea). Unpartitioned sends are what the cost model charges
            # (CommSchedule.pp_scatter_gather is False for this engine).
            config["pipeline"] = {**config.get("pipeline", {}), "pipe_partitioned": False, "grad_partitioned": False}
        files = {DS_CONFIG: json.dumps(config, indent=2) + "\n",
                 "megatron_deepspeed_args.sh": shell_array(
                     "MEGATRON_DEEPSPEED_ARGS", argv, env, "Megatron-DeepSpeed pretrain_gpt.py arguments written by "
                                                           "autotune")}
        entry = (options.launch.script or "pretrain_gpt.py",)
        return EngineFiles(files=files, entry=entry, program_args=argv, env=env, launcher="deepspeed",
                           user_script_needs=("Megatron-DeepSpeed's pretrain_gpt.py (CUDA) with these arguments",))
