"""Checkpoint folders as the engines lay them out, for tests/test_job_checkpoint*.py (their own savers run in
tests/test_job_checkpoint_real.py)."""
from __future__ import annotations

import argparse
import enum
import json
import sys
import types

import pytest
import torch

from autotune.cli import main

ENUMS = "megatron.core.transformer.enums"


def megatron_enums(monkeypatch):
    """Megatron-core's AttnBackend (values of core_v0.19.0), pickled under its own module name though megatron is
    not installed here: the module exists while the test saves and is gone when autotune reads."""
    module = types.ModuleType(ENUMS)

    class AttnBackend(enum.Enum):
        flash, fused, unfused, local, auto = 1, 2, 3, 4, 5

    AttnBackend.__module__, AttnBackend.__qualname__ = ENUMS, "AttnBackend"
    module.AttnBackend = AttnBackend
    for name in ("megatron", "megatron.core", "megatron.core.transformer"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, ENUMS, module)
    return AttnBackend


def megatron_args(backend, **over) -> argparse.Namespace:
    """Llama-3-70B on 64 GPUs as Megatron's validated arguments hold it (dests of megatron/training/arguments.py)."""
    values = dict(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, kv_channels=128,
                  group_query_attention=True, num_query_groups=8, seq_length=8192, max_position_embeddings=8192,
                  swiglu=True, normalization="RMSNorm", position_embedding_type="rope", rotary_base=500000,
                  untie_embeddings_and_output_weights=True, add_bias_linear=False, micro_batch_size=1,
                  global_batch_size=512, tensor_model_parallel_size=8, pipeline_model_parallel_size=4,
                  num_layers_per_virtual_pipeline_stage=5, virtual_pipeline_model_parallel_size=4,
                  sequence_parallel=True, bf16=True, fp16=False, use_distributed_optimizer=True,
                  overlap_grad_reduce=True, recompute_granularity="selective", world_size=64, rank=0,
                  params_dtype=torch.bfloat16, attention_backend=backend.auto, num_experts=None,
                  expert_tensor_parallel_size=8, moe_token_dispatcher_type="allgather", padded_vocab_size=128256,
                  vocab_size=128256, cp_comm_type=["p2p"], context_parallel_size=1)
    return argparse.Namespace(**(values | over))


def save_megatron(folder, state, layout: str) -> None:
    """A save as megatron/training/checkpointing.py (core_v0.19.0) lays it out: the tracker, then iter_0000100/ with
    the legacy torch_dist common.pt or the torch format's mp_rank_00/model_optim_rng.pt."""
    save = folder / "iter_0000100"
    if layout == "torch":
        (save / "mp_rank_00").mkdir(parents=True)
        torch.save(state | {"model": {"w": torch.zeros(16)}}, save / "mp_rank_00" / "model_optim_rng.pt")
    else:
        save.mkdir(parents=True)
        torch.save(state, save / "common.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text("100\n")


def estimate(capsys, *argv) -> tuple[int, dict | str]:
    code = main(["estimate", "--gpu", "h100-sxm-80gb", "--json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)

class Payload:
    """An object whose unpickling calls ``call(*args)``, as a hostile checkpoint would hold one."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args

def deepspeed_save(folder, state, *, zero3: bool = False) -> None:
    """DeepSpeed's layout (runtime/engine.py 0.19.8): ``latest`` names the tag, whose folder holds rank 0's model
    states (``zero_pp_rank_0_mp_rank_00_model_states.pt`` under ZeRO-3)."""
    tag = folder / "global_step20"
    tag.mkdir(parents=True)
    name = "zero_pp_rank_0_mp_rank_00_model_states.pt" if zero3 else "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.zeros(4)}, "global_steps": 20, "ds_version": "0.19.8"} | state, tag / name)
    (folder / "latest").write_text("global_step20")


DS_CONFIG = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
             "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
PHI3_CONFIG = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
               "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 32, "max_position_embeddings": 4096, "hidden_act": "silu",
               "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False}

def trainer_args(folder, **kw):
    """TrainingArguments saved as the Trainer saves them with a checkpoint (transformers trainer.py:4229)."""
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(folder / "out"), use_cpu=True, report_to=[], **kw)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(args, folder / "training_args.bin")
    (folder / "config.json").write_text(json.dumps(PHI3_CONFIG))

def save_torch_dist(folder, state) -> None:
    """A torch_dist save as megatron-core 0.19 writes it (its own saver: tests/test_job_checkpoint_real.py): the common
    state one pickled entry of the torch.distributed.checkpoint files (serialization.py:206-237), metadata.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    save = folder / "iter_0000100"
    save.mkdir(parents=True)
    dcp.save({"common_state/shard_0_1": [state]}, storage_writer=dcp.FileSystemWriter(str(save)),
             planner=DefaultSavePlanner(flatten_state_dict=False), no_dist=True)  # one entry, as a ShardedObject
    (save / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    (folder / "latest_checkpointed_iteration.txt").write_text("100")
