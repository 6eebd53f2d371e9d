"""Lint a DeepSpeed config for a world size, reporting every problem at once.

Three layers, each problem with its JSON path (and line, for a file):

(a) ``schemas/deepspeed_config.schema.json``: types, enums, bounds; unknown keys are errors in the
    blocks DeepSpeed rejects them in and warnings where DeepSpeed ignores them silently
    (``x-unknown-keys: warn``); deprecated keys are warnings.
(b) DeepSpeed's own parser, ``deepspeed.runtime.config.DeepSpeedConfig``, in-process, for the
    data-parallel size world / (tp x pp x cp). It raises on the first problem, so each problem it
    finds is repaired in a copy and the parser runs again, until it accepts the config.
(c) Cross-field rules DeepSpeed checks late (at ``deepspeed.initialize`` or in the engine) or never:
    the batch triple, ZeRO-2/3 with pipeline parallelism, offload prerequisites, removed keys, ...

``"auto"`` is a Hugging Face Trainer / accelerate value: an error for DeepSpeed proper, and with
``hf=True`` replaced first as the integration would (``autotune.emit.deepspeed.HF_AUTO_PATHS``).
"""

from __future__ import annotations

from pathlib import Path

from autotune.emit.problems import Problem
from autotune.emit.validate_deepspeed import deepspeed_problems
from autotune.emit.validate_json import get, has_errors, is_int, json_path, read_deepspeed_config
from autotune.emit.validate_rules import rule_problems
from autotune.emit.validate_schema import auto_problems, autos, schema_problems, substitute
from autotune.errors import InputError
from autotune.resources import schema as shipped_schema

__all__ = ["validate_deepspeed_config", "read_deepspeed_config", "resolved_config", "batch_triple_problem",
           "has_errors", "json_path"]


# ---- the entry point -------------------------------------------------------------------------
def _data_parallel_size(world_size: int, tp: int, pp: int, cp: int) -> int:
    problems = [f"{n} must be a positive integer, got {v!r}" for n, v in
                (("world_size", world_size), ("tp", tp), ("pp", pp), ("cp", cp)) if not (is_int(v) and v >= 1)]
    if not problems and world_size % (tp * pp * cp):
        problems.append(f"world size {world_size} is not divisible by tp x pp x cp = {tp} x {pp} x {cp}: "
                        f"choose sizes whose product divides {world_size}")
    if problems:
        raise InputError(problems, subject="validate request")
    return world_size // (tp * pp * cp)


def _effective_tp(data: dict, tp: int) -> int:
    """With tp left at 1, an AutoTP config's own autotp_size is the tensor-parallel size."""
    autotp = get(data, ("tensor_parallel", "autotp_size"))
    return int(autotp) if tp == 1 and is_int(autotp) and autotp > 1 else tp


def _batch_data_parallel(data: dict, dp: int, tp: int) -> int:
    """The data-parallel count DeepSpeed checks the batch triple with: with AutoTP, DeepSpeed 0.19.8 checks the
    batch sizes before it makes the TP groups, with no mpu, so that count includes the TP ranks
    (runtime/config.py:466-471); the HF integration fills "auto" as micro x accumulation x all ranks, the same."""
    return dp * tp if tp > 1 and get(data, ("tensor_parallel", "autotp_size")) == tp else dp


def resolved_config(data: dict, *, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1) -> dict:
    """``data`` with each Hugging Face "auto" replaced as the integration would (batch sizes for the world size)."""
    tp = _effective_tp(data, tp)
    dp = _data_parallel_size(world_size, tp, pp, cp)
    return substitute(data, autos(data, shipped_schema("deepspeed_config.schema.json")),
                      _batch_data_parallel(data, dp, tp))


def validate_deepspeed_config(config: dict | str | Path, *, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1,
                              hf: bool = False, client_optimizer: str | None = None) -> list[Problem]:
    """Every problem of a DeepSpeed config (a dict or a JSON file) for ``world_size`` ranks.

    DeepSpeed's data-parallel size is world / (tp x pp x cp); with ``tp`` 1 and an AutoTP config
    (``tensor_parallel.autotp_size``), that size is the TP degree. ``hf``: the config is for the
    Hugging Face Trainer / accelerate, whose ``"auto"`` values are filled in before checking.
    ``client_optimizer``: the optimizer the program passes to deepspeed.initialize, where known
    (``autotune.emit.validate_rules.rule_problems``). Raises InputError for an unusable file or sizes;
    malformed JSON is a problem with its line.
    """
    data, lines, problems = read_deepspeed_config(config)
    if data is None:
        return problems
    tp = _effective_tp(data, tp)
    dp = _data_parallel_size(world_size, tp, pp, cp)
    found = autos(data, shipped_schema("deepspeed_config.schema.json"))
    problems += auto_problems(found, hf, lines)
    # AutoTP: the batch triple counts the TP ranks too, in DeepSpeed's check and in the HF "auto" fill.
    batch_dp = _batch_data_parallel(data, dp, tp)
    checked = substitute(data, found, batch_dp)
    problems += schema_problems(checked, lines)
    problems += rule_problems(checked, world=world_size, tp=tp, pp=pp, cp=cp, dp=batch_dp, lines=lines,
                              client_optimizer=client_optimizer)
    problems += deepspeed_problems(checked, batch_dp, problems, lines)
    return problems


def batch_triple_problem(ds: dict, world: int, mp: int) -> str | None:
    """Why DeepSpeed refuses a config whose train_batch_size is not micro x accumulation x dp (naming the world size
    it is written for), or None."""
    batch, micro, accum = (ds.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                "gradient_accumulation_steps"))
    if not all(isinstance(v, int) and v > 0 for v in (batch, micro, accum)) or mp < 1 or world % mp:
        return None
    dp = world // mp
    autotp = (ds.get("tensor_parallel") or {}).get("autotp_size") or 1
    if batch in (micro * accum * dp, micro * accum * dp * autotp):
        return None
    fits = f": it is written for dp {batch // (micro * accum)} (--num-gpus {batch // (micro * accum) * mp})" if (
        batch % (micro * accum) == 0) else ""
    return (f"the DeepSpeed config's train_batch_size ({batch}) is not train_micro_batch_size_per_gpu ({micro}) x "
            f"gradient_accumulation_steps ({accum}) x dp ({dp} = {world} GPUs / tp*pp*cp {mp}), which DeepSpeed "
            f"refuses{fits}")


def batch_triple_world(ds: dict, tp: int, pp: int, cp: int) -> int | None:
    """The world size a DeepSpeed config's complete batch triple admits: train_batch_size / (micro x accumulation)
    data-parallel ranks x tp * pp * cp, the only size DeepSpeed's ``_batch_assertion`` accepts with all three given
    (deepspeed 0.19.8 runtime/config.py:590-605: train_batch == micro * grad_acc * world_size, the world size over
    the model-parallel ranks); AutoTP's ranks (``tensor_parallel.autotp_size``) are in that world size already
    (runtime/config.py:466-471: no mpu, so every rank), so ``tp`` is not multiplied in then. None where one of the
    three is missing or "auto", or the division is not exact."""
    batch, micro, accum = (ds.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                "gradient_accumulation_steps"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (batch, micro, accum)):
        return None
    block = ds.get("tensor_parallel")
    autotp = block.get("autotp_size") if isinstance(block, dict) else 0
    if isinstance(autotp, int) and not isinstance(autotp, bool) and autotp > 1:
        tp = 1
    return batch // (micro * accum) * tp * pp * cp if batch % (micro * accum) == 0 else None
