"""Hugging Face Trainer / accelerate driving DeepSpeed ZeRO: data parallelism with ZeRO 0-3 and offload.

The Trainer fills the ``"auto"`` values of ``ds_config_hf.json`` from ``TrainingArguments``; accelerate takes
a DeepSpeed config with concrete values (``accelerate_config.yaml`` + ``ds_config_accelerate.json``).
Model parallelism (AutoTP, pipelines, Ulysses) is not driven through this path here: plans with tp, pp or
cp > 1 run on the ``deepspeed`` engine.
"""

from __future__ import annotations

import json

from autotune.emit.accelerate import (ACCELERATE_DS_CONFIG, ACCELERATE_RELEASE, accelerate_deepspeed_config,
                                      accelerate_deepspeed_yaml)
from autotune.emit.deepspeed import hf_deepspeed_config
from autotune.emit.launch import render_accelerate_script
from autotune.engines.base import Engine
from autotune.engines.builtin_trainer import HF_OWN_BALANCING, hf_model_family, hf_trainer_problem
from autotune.engines.common import builtin_or_user_entry
from autotune.engines.deepspeed import ZERO_WORDS, DeepSpeedEngine, offload_rules, zero_buffers
from autotune.engines.facts import CommSchedule, EngineFiles, EngineSupport, Rule
from autotune.specs.engine_versions import EngineVersions
from autotune.specs.notation import plan_notation

__all__ = ["HFEngine"]

HF_DS_CONFIG = "ds_config_hf.json"


class HFEngine(Engine):
    name = "hf"
    title = "Hugging Face Trainer / accelerate (DeepSpeed backend)"
    accelerate_distributed_type = "DEEPSPEED"
    version = f"transformers 5.24 / accelerate {ACCELERATE_RELEASE} / DeepSpeed 0.19.8"
    versions = EngineVersions("transformers", "transformers", ("5",),
                              companions=(("accelerate", ACCELERATE_RELEASE), ("deepspeed", "0.19")))
    support = EngineSupport(tp=None, sequence_parallel=False, pp=None, vpp=False, layer_split="megatron",
                            tp_with_pp=False, cp=None, ep=False, zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(),
                            offload_optimizer=("none", "cpu", "nvme"), offload_param=("none", "cpu", "nvme"),
                            precisions=("bf16", "fp16"))
    # transformers' modules (LlamaRMSNorm, LlamaMLP, apply_rotary_pos_emb) run op by op without torch.compile.
    comm = CommSchedule(dp_overlap="bucketed", param_gather="prefetch", pipeline_schedule=None, cp_kind=None,
                        elementwise_kernels="eager")
    checkpoint_format = "deepspeed"
    # transformers 5.24 trainer.py: _save_checkpoint calls save_model at every save, which takes
    # accelerator.get_state_dict(deepspeed engine) (ZeRO-3: DeepSpeed's _zero3_consolidated_16bit_state_dict, each
    # module's parameters gathered in turn and copied to rank 0's host memory; it raises, and the Trainer saves
    # the sharded checkpoint alone, when stage3_gather_16bit_weights_on_model_save is false) and writes it as
    # safetensors from the main process; then _save_optimizer_and_scheduler calls engine.save_checkpoint.
    consolidates_weights_at_save = True
    workload = "builtin"
    trainer_module = "autotune.train.hf"
    uses_deepspeed_ops = True
    sources = {"tp": "the HF path here is data-parallel ZeRO; use engine deepspeed for AutoTP",
               "pp": "transformers Trainer has no pipeline schedule; use engine deepspeed or megatron",
               "cp": "use engine deepspeed for Ulysses"}

    def builtin_trainer_problem(self, model, plan) -> str | None:
        return hf_trainer_problem(model, plan)

    def extra_problems(self, model, cluster, plan) -> list[Rule]:
        return offload_rules(self, plan)

    def model_states(self, model, plan, stage, dense_params, expert_params):
        return DeepSpeedEngine().model_states(model, plan, stage, dense_params, expert_params)

    def buffers(self, model, plan, groups, settings, fp8_any_layout=False, stage=0) -> dict[str, float]:
        del fp8_any_layout, stage  # none of its buffers depends on the GPU's FP8 GEMM layouts or the stage
        return zero_buffers(model, plan, groups, settings)

    def saved_states_plan(self, plan):
        return plan.with_(offload_optimizer="none", offload_param="none"), plan.zero_stage != 3

    def tag(self, plan) -> str:
        return f"hf-zero{plan.zero_stage}"

    def sharding(self, plan) -> str:
        return ZERO_WORDS[plan.zero_stage]

    def render_files(self, model, cluster, plan, options, checkpoint, env) -> EngineFiles:
        hf_config = hf_deepspeed_config(model, cluster, plan, options,
                                        gather_16bit=checkpoint.gather_16bit_weights_on_model_save)
        files = {HF_DS_CONFIG: json.dumps(hf_config, indent=2) + "\n",
                 ACCELERATE_DS_CONFIG: json.dumps(accelerate_deepspeed_config(model, cluster, plan, options),
                                                  indent=2) + "\n",
                 ACCELERATE_YAML: accelerate_deepspeed_yaml(model, cluster, plan, options)}
        # torchrun / deepspeed / SLURM scripts: the HF Trainer with ds_config_hf.json; launch_accelerate.sh:
        # accelerate with ds_config_accelerate.json. A user's script gets the same launchers, no extra arguments.
        entry, args = builtin_or_user_entry(options, ["--hf-config", HF_DS_CONFIG], [])
        acc_entry, acc_args = builtin_or_user_entry(options, ["--accelerate"], [])
        files["launch_accelerate.sh"] = render_accelerate_script(
            cluster, plan, options, config_file=ACCELERATE_YAML, ds_config_file=ACCELERATE_DS_CONFIG,
            program_args=acc_args, env=env, entry=acc_entry, bundle_files={*files, "plan.json"},
            summary=plan_notation(plan, self.tag(plan)))
        cpu = cluster.gpu.name == "cpu"
        o = options.optimizer
        needs = (f"Trainer: TrainingArguments(deepspeed='<bundle>/{HF_DS_CONFIG}' (its absolute path: a relative "
                 f"name is opened from the folder the script runs in), "
                 f"per_device_train_batch_size={plan.micro_batch_size}, "
                 f"gradient_accumulation_steps={plan.grad_accum_steps}, "
                 # the config's optimizer and WarmupCosineLR are "auto": the Trainer fills them from these, else
                 # from its own defaults (lr 5e-5, no weight decay, beta2 0.999: transformers integrations/deepspeed.py)
                 f"learning_rate={o.lr:g}, adam_beta1={o.betas[0]:g}, adam_beta2={o.betas[1]:g}, "
                 f"adam_epsilon={o.eps:g}, weight_decay={o.weight_decay:g}, max_grad_norm={o.grad_clip:g}, "
                 f"warmup_steps={o.warmup_steps}, max_steps={o.train_steps}, "
                 f"{'bf16' if plan.precision != 'fp16' else 'fp16'}=True"
                 + (", gradient_checkpointing=True" if plan.recompute == "full" else "")
                 + f", save_strategy='steps', save_steps={checkpoint.interval_steps}, "
                   f"save_total_limit={options.checkpoint.keep_last}, output_dir='{checkpoint.save_dir}'"
                 + (", use_cpu=True, ddp_backend='gloo'" if cpu else "") + ")"
                 + ("; on this CPU-only cluster TrainingArguments needs use_cpu=True (without it transformers "
                    "raises \"Your setup doesn't support bf16/gpu. You need to assign use_cpu if you want to train "
                    "the model on CPU.\") and ddp_backend='gloo', as autotune.train.hf passes them" if cpu else "")
                 + "; the optimizer and schedule values are the plan's (ds_config_hf.json leaves them \"auto\" for "
                   "the Trainer to fill: without them it trains at its own defaults, lr 5e-5 and no weight decay); "
                   "save_steps is the checkpoint policy's interval (see Checkpoint policy); each save holds the "
                   "optimizer, LR scheduler and RNG states: resume with trainer.train(resume_from_checkpoint=True)",
                 f"accelerate (launch_accelerate.sh, {ACCELERATE_DS_CONFIG}): optimizer = "
                 "accelerate.utils.DummyOptim(model.parameters()), scheduler = DummyScheduler(optimizer), "
                 "accelerator.prepare(model, optimizer, scheduler), and steps inside accelerator.accumulate(model); "
                 f"every {checkpoint.interval_steps} steps accelerator.save_state('{checkpoint.save_dir}/step-N') "
                 "(model, optimizer, LR scheduler, RNG), accelerator.load_state(...) of the newest to resume; "
                 f"{ACCELERATE_YAML}'s deepspeed_config_file is opened from the folder accelerate runs in: start "
                 f"launch_accelerate.sh (it passes both paths, from any folder), or run accelerate launch "
                 f"--config_file {ACCELERATE_YAML} from the bundle folder"
                 + (f"; on this CPU-only cluster accelerate {ACCELERATE_RELEASE} reports num_processes 1 and "
                    "process_index 0 on every rank (it counts processes on accelerators only) while DeepSpeed's "
                    f"group spans all {plan.world_size} ranks: split the data by torch.distributed.get_rank() and "
                    "get_world_size() (a DataLoader passed to accelerator.prepare would give every rank the same "
                    "batches), and use torch.distributed, not accelerator.gather / reduce / is_main_process, for "
                    "what spans ranks (accelerate sizes and divides those by its 1 process: a mean over 2 ranks "
                    "comes out doubled, every rank is the main one and writes the same random_states_0.pkl in "
                    "save_state; accelerate state.py, utils/operations.py)"
                    if cpu else ""))
        needs += _balancing_needs(model, plan)
        return EngineFiles(files=files, entry=entry, program_args=args, env=env, launcher="torchrun",
                           user_script_needs=needs)


def _balancing_needs(model, plan) -> tuple[str, ...]:
    """What a user's Trainer script must do for the checkpoint's MoE balancing loss (autotune.train.hf_balancing
    does it in the built-in trainer)."""
    moe = model.moe
    if moe is None or not moe.aux_loss_coeff:
        return ()
    added = hf_model_family(model) in HF_OWN_BALANCING
    need = (f"the MoE load-balancing loss at the checkpoint's weight {moe.aux_loss_coeff:g}: "
            + ("set output_router_logits=True (the class then adds router_aux_loss_coef x its aux_loss to the loss)"
               if added else "transformers' class adds none: add it from the router logits "
               "(output_router_logits=True)" + (", per sequence" if moe.aux_loss_per_sequence else "")))
    if plan.grad_accum_steps > 1:
        need += (f"; with gradient_accumulation_steps={plan.grad_accum_steps}, transformers 5.25's Trainer divides "
                 "the loss by the accumulated batch's token count (num_items_in_batch) and no longer by the steps, "
                 f"so a balancing loss added per micro-batch weighs {plan.grad_accum_steps} x its weight: scale it by "
                 "the micro-batch's share of those tokens in compute_loss")
    return (need,)


ACCELERATE_YAML = "accelerate_config.yaml"
