"""The plan a Hugging Face Trainer checkpoint's ``training_args.bin`` states (``autotune.job_checkpoint`` reads it).

The Trainer saves its whole ``TrainingArguments`` with every checkpoint (transformers 5.25 trainer.py:4229,
``torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))``, the name ``training_args.bin`` :245). After
``__post_init__`` the object holds what the run trained with: ``per_device_train_batch_size``,
``gradient_accumulation_steps``, ``bf16`` / ``fp16``, ``activation_checkpointing``, the FSDP settings normalised into
``fsdp_config`` (training_args.py:2905-2934: ``full_shard`` -> ``reshard_after_forward`` True, ``shard_grad_op`` ->
False, ``offload`` -> ``cpu_offload``; FSDP2 unless ``version`` 1), ``deepspeed`` (a config path or dict), and the
launched processes in ``distributed_state`` (accelerate's ``PartialState``: ``num_processes``).

An FSDP run is the ``fsdp`` engine (accelerate prepares the model with FSDP2's ``fully_shard``, as the accelerate
reader takes an FSDP accelerate config); a DeepSpeed run is the ``hf`` engine (the Trainer driving DeepSpeed), whose
config comes from the DeepSpeed model states saved beside (the Trainer's "auto" values filled). A run with neither
is plain DDP: the ``fsdp`` engine without sharding (zero 0). The sequence length is the data's, not an argument.
"""

from __future__ import annotations

from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.errors import InputError
from autotune.job_fsdp import fsdp2_fields

__all__ = ["TRAINER_ARGS", "trainer_fields"]

TRAINER_ARGS = "training_args.bin"


def _count(state: dict, name: str, path: str) -> int:
    value = state.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError([f"{path}: TrainingArguments.{name} is {value!r}, not a positive whole number: give the "
                          f"job's files to --from instead"], subject=_SUBJECT)
    return value


def trainer_fields(state: dict, world: int | None, path: str, notes: list[str]) -> dict:
    """The plan fields of the Trainer arguments ``state`` (the object's attributes) for ``world`` processes (None:
    unknown, the caller asks for --num-gpus); the engine is ``hf`` where the run used DeepSpeed (its config read
    from the model states by the caller)."""
    micro, accum = _count(state, "per_device_train_batch_size", path), _count(state, "gradient_accumulation_steps",
                                                                                path)
    fsdp_config = state.get("fsdp_config") if isinstance(state.get("fsdp_config"), dict) else {}
    precision = "bf16" if state.get("bf16") else "fp16" if state.get("fp16") else None
    if precision is None:
        notes.append(f"{path}: neither bf16 nor fp16 (the Trainer trains in fp32): estimated as bf16")
    # activation_checkpointing (transformers 5.25; gradient_checkpointing: its deprecated alias, training_args.py
    # :302-315)
    recompute = bool(state.get("activation_checkpointing") or state.get("gradient_checkpointing")) or str(
        fsdp_config.get("activation_checkpointing", "false")).lower() == "true"
    every = (state.get("activation_checkpointing_kwargs") or {}).get("every_n_layers") if isinstance(
        state.get("activation_checkpointing_kwargs"), dict) else None
    if recompute and isinstance(every, int) and every > 1:
        notes.append(f"{path}: activation checkpointing every {every} layers: estimated on every layer")
    out: dict = {"micro_batch_size": micro, "precision": precision or "bf16",
                 "recompute": "full" if recompute else "none"}
    if world:
        out["global_batch_size"] = micro * accum * world
    if state.get("deepspeed"):
        return out | {"engine": "hf"}
    if state.get("torch_compile"):
        out["torch_compile"] = True
    if not state.get("fsdp"):
        notes.append(f"{path}: no FSDP and no DeepSpeed: plain DDP, estimated as FSDP without sharding (zero 0)")
        return out | {"engine": "fsdp", "zero_stage": 0}
    if int(fsdp_config.get("version", 2)) != 2:
        notes.append(f"{path}: FSDP1 (fsdp_config version 1, deprecated in transformers 5): estimated as FSDP2")
    return out | fsdp2_fields(str(fsdp_config.get("reshard_after_forward", True)).lower() in ("true", "full_shard"),
                              str(fsdp_config.get("cpu_offload", False)).lower() == "true")
