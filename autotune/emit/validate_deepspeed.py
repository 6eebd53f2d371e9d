"""Layer (b) of the DeepSpeed config linter: DeepSpeed's own parser (``DeepSpeedConfig``), in-process, for the
data-parallel size. It raises on the first problem, so each problem is repaired in a copy and the parser runs
again, until it accepts the config."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import re
import sys

from autotune.emit.deepspeed import DEEPSPEED_VERSION
from autotune.emit.problems import Problem
from autotune.emit.validate_json import BATCH_KEYS, Parts, get, is_int, json_path, line_of

__all__ = ["deepspeed_problems", "removed_keys"]

# pydantic model (ValidationError.title) -> its block in the config.
_MODEL_BLOCKS = {"DeepSpeedZeroConfig": ("zero_optimization",), "DeepSpeedFP16Config": ("fp16",),
                 "DeepSpeedBF16Config": ("bf16",), "TPTrainingConfig": ("tensor_parallel",),
                 "CommsLoggerConfig": ("comms_logger",), "DeepSpeedMonitorConfig": (), "CompileConfig": ("compile",),
                 "HybridEngineConfig": ("hybrid_engine",), "DeepSpeedThroughputTimerConfig": ("timers", "throughput")}


# ---- DeepSpeed itself -------------------------------------------------------------------------
@functools.cache
def _deepspeed():
    """(deepspeed.runtime.config, deepspeed.comm, DeepSpeed's logger), imported once without printing on stdout."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):  # the accelerator notice goes to DeepSpeed's stdout logger
        import deepspeed.comm as dist
        from deepspeed.runtime import config as ds_config
        from deepspeed.utils import logger
    for handler in logger.handlers:
        if getattr(handler, "stream", None) is buf:
            handler.setStream(sys.stdout)
    return ds_config, dist, logger


def removed_keys() -> tuple[dict[str, str], dict[str, str]]:
    """Keys the installed DeepSpeed raises DeepSpeedConfigError for (top level, zero_optimization), with its reason."""
    ds_config = _deepspeed()[0]  # the installed version's own lists; 0.19.8's when it has none
    top = getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", None) or dict.fromkeys(
        ("nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
         "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop"),
        f"removed in DeepSpeed {DEEPSPEED_VERSION}")
    zero = getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", None) or dict.fromkeys(
        ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"),
        f"removed in DeepSpeed {DEEPSPEED_VERSION}")
    return dict(top), dict(zero)


def _explain(err: BaseException) -> list[tuple[Parts, str]]:
    """Where in the config DeepSpeed's exception points, and its message."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError):
        prefix = _MODEL_BLOCKS.get(err.title, ())
        out = []
        for e in err.errors():
            msg = re.sub(r"^(Value error|Assertion failed), ", "", e["msg"])
            out.append((prefix + tuple(e["loc"]), f"{msg} (got {e.get('input')!r})" if e["loc"] else msg))
        return out
    message = str(err).strip() or type(err).__name__
    top, zero = removed_keys()
    for parts, pattern in [((k,), f"'{k}'") for k in top] + [(("zero_optimization", k), f"'zero_optimization.{k}'")
                                                             for k in zero]:
        if pattern in message:
            return [(parts, message)]
    for parts, needle in ((("train_batch_size",), "batch"), (("train_batch_size",), "Gradient accumulation"),
                          (("bf16", "enabled"), "bfloat16 and fp16"),
                          (("checkpoint", "tag_validation"), "tag_validation"),
                          (("checkpoint", "parallel_write", "pipeline_stage"), "parallel_write"),
                          (("data_types", "keep_in_fp32_modules"), "keep_in_fp32_modules"),
                          (("communication_data_type",), "communication_data_type"),
                          (("gradient_allreduce_op",), "gradient_allreduce_op")):
        if needle in message:
            return [(parts, message)]
    return [((), f"{type(err).__name__}: {message}")]


def _repair(cfg: dict, parts: Parts) -> bool:
    """Undo the problem at ``parts`` in ``cfg`` so DeepSpeed's parser can go on; False if it cannot."""
    if parts == ("train_batch_size",):  # keep micro-batch and accumulation; DeepSpeed derives the rest
        changed = cfg.pop("train_batch_size", None) is not None
        for key in BATCH_KEYS[1:]:
            if not (is_int(cfg.get(key)) and cfg[key] > 0):
                cfg[key], changed = 1, True
        return changed
    if parts == ("bf16", "enabled") and isinstance(cfg.get("fp16"), dict):
        cfg["fp16"]["enabled"] = False
        return True
    parent = get(cfg, parts[:-1]) if parts else None
    if isinstance(parent, dict) and parts[-1] in parent:
        del parent[parts[-1]]
        return True
    return False


def deepspeed_problems(cfg: dict, dp: int, found: list[Problem], lines: dict) -> list[Problem]:
    ds_config, dist, logger = _deepspeed()
    work, out = copy.deepcopy(cfg), []
    batch_paths = {json_path((k,)) for k in BATCH_KEYS}
    reported = {p.path for p in found if p.severity == "error"}
    for _ in range(16):
        saved = dist.get_world_size, dist.get_rank, logger.disabled
        # With sequence_parallel_size (no mpu) DeepSpeed divides the world by it (runtime/config.py:468).
        sp = work.get("sequence_parallel_size")
        world = dp * sp if isinstance(sp, int) and not isinstance(sp, bool) and sp > 1 else dp
        dist.get_world_size, dist.get_rank = (lambda group=None: world), (lambda group=None: 0)
        logger.disabled = True  # DeepSpeed logs to stdout, which is --json's
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                ds_config.DeepSpeedConfig(copy.deepcopy(work))
            return out
        except Exception as err:  # noqa: BLE001 - every exception DeepSpeed raises is a finding, reported below
            explained = _explain(err)
        finally:
            dist.get_world_size, dist.get_rank, logger.disabled = saved
        progress = False
        for parts, message in explained:
            path = json_path(parts)
            duplicate = path in reported or (path in batch_paths and reported & batch_paths)
            if not duplicate:
                out.append(Problem(path=path, severity="error", message=message, line=line_of(lines, parts),
                                   source="deepspeed",
                                   fix="change the value so that DeepSpeed's parser (DeepSpeedConfig) accepts it"))
                reported.add(path)
            progress = _repair(work, parts) or progress
        if not progress:
            return out
    return out

