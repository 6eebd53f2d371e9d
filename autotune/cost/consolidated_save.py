"""The whole 16-bit model the Hugging Face Trainer writes from rank 0 at every save, beside DeepSpeed's checkpoint.

transformers 5.24 (trainer.py): ``_save_checkpoint`` calls ``save_model``, which takes
``accelerator.get_state_dict(<DeepSpeed engine>)`` and writes it as safetensors from the main process, then
``engine.save_checkpoint``. Under ZeRO-3 that state dict is DeepSpeed 0.19.8's
``_zero3_consolidated_16bit_state_dict`` (runtime/engine.py): each module's parameters all-gathered in turn over the
data-parallel group and copied into rank 0's host memory, so node 0 holds the whole 2 Psi model at a save; with
``stage3_gather_16bit_weights_on_model_save`` false it raises and the Trainer saves the sharded checkpoint alone
("Saving the full checkpoint instead, use zero_to_fp32.py to recover weights"). ZeRO-0/1/2 keep the weights whole
on every rank and safetensors serialises one file at a time (at most ``SAFETENSORS_SHARD_BYTES``).

This is the chapter's "gather or shard" pitfall: a plan that trains within its host memory can fail at its first
save (a 70B model is 141 GB on node 0). The policy turns the gather off where node 0 cannot hold it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.specs.hardware import GB, GIB

__all__ = ["ConsolidatedSave", "SAFETENSORS_SHARD_BYTES", "consolidated_save"]

SAFETENSORS_SHARD_BYTES = 50e9
"""transformers 5.x ``save_pretrained(max_shard_size="50GB")`` (modeling_utils.py): the largest file serialised in
host memory at once."""


@dataclass(frozen=True, slots=True)
class ConsolidatedSave:
    written: bool
    """False: nothing consolidated (no such engine, or ZeRO-3's gather turned off)."""
    stall_s: float = 0.0
    """Training blocked per save: the ZeRO-3 gather plus rank 0's write."""
    write_s: float = 0.0
    host_bytes: float = 0.0
    """Node 0's host memory for it during a save."""
    note: str = ""


def consolidated_save(model_bytes: float, *, zero3: bool, host_free: float, link_gb_per_s: float,
                      writer_gb_per_s: float) -> ConsolidatedSave:
    """``model_bytes``: the whole 16-bit model (0: the engine writes none). ``host_free``: node 0's host memory
    beside offloaded states and checkpoint staging; ``link_gb_per_s``: a GPU's bandwidth in the gather's group
    (inter-node once it spans nodes); ``writer_gb_per_s``: one writer's path to storage (the slower of the
    storage and rank 0's link)."""
    if not model_bytes:
        return ConsolidatedSave(written=False)
    gib = f"{model_bytes / GIB:,.1f} GiB"
    free = f"{max(host_free, 0.0) / GIB:,.1f} GiB"
    host = model_bytes if zero3 else min(model_bytes, SAFETENSORS_SHARD_BYTES)
    if zero3 and host > host_free:
        return ConsolidatedSave(written=False, note=(
            f"stage3_gather_16bit_weights_on_model_save is off: the Hugging Face Trainer would gather the whole "
            f"16-bit model ({gib}) into rank 0's host memory at every save, and node 0 has {free} free; each save "
            f"writes DeepSpeed's sharded checkpoint alone, and `python zero_to_fp32.py <checkpoint folder> <out>` "
            f"(DeepSpeed puts the script in each checkpoint folder) rebuilds the weights offline."))
    gather_s = model_bytes / (link_gb_per_s * GB) if zero3 else 0.0
    write_s = model_bytes / (writer_gb_per_s * GB)
    note = ""
    if host > host_free:
        note = (f"Each save of the Hugging Face Trainer serialises up to {host / GIB:,.1f} GiB of safetensors in rank "
                f"0's host memory and node 0 has {free} free: the first save may run out of host memory "
                f"(fewer offloaded states or more host memory per node leave room for it).")
    return ConsolidatedSave(written=True, stall_s=gather_s + write_s, write_s=write_s, host_bytes=host, note=note)
