"""Layer (c) of the DeepSpeed config linter: cross-field rules DeepSpeed checks late (at
``deepspeed.initialize`` or in the engine) or never: the batch triple, ZeRO-2/3 with pipeline parallelism,
offload prerequisites, removed keys, optimizer and scheduler names, AutoTP size."""

from __future__ import annotations

import math

from autotune.emit.deepspeed import DEEPSPEED_VERSION
from autotune.emit.problems import Problem
from autotune.emit.validate_deepspeed import removed_keys
from autotune.emit.validate_json import BATCH_KEYS, Parts, get, is_int, json_path, line_of
from autotune.emit.validate_schema import close_key

__all__ = ["rule_problems", "CLIENT_CPU_OPTIMIZERS"]

# Optimizers ZeRO runs without zero_allow_untested_optimizer (zero/utils.py:45, by config name after
# config.py:519 lower-cases DeepSpeed's own names); torch's Adam/AdamW/Adagrad map onto these.
_ZERO_TESTED_OPTIMIZERS = frozenset({"adam", "adamw", "adagrad", "lion", "muon"})
_DS_OPTIMIZERS = frozenset({"adam", "adamw", "adagrad", "lamb", "lion", "muon", "muadam", "muadamw", "musgd"})
_DS_SCHEDULERS = frozenset({"LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"})

CLIENT_CPU_OPTIMIZERS = ("DeepSpeedCPUAdam", "DeepSpeedCPULion")
"""The client optimizers DeepSpeed runs under ZeRO-Offload (0.19.8 runtime/engine.py:2342-2346 checks the type of the
optimizer passed to deepspeed.initialize): a ``client_optimizer`` of :func:`rule_problems` naming one is known to be
passed (a Megatron-DeepSpeed script's ``--cpu-optimizer``: ``megatron_deepspeed_pair.client_optimizer``)."""


# ---- (c) cross-field rules -------------------------------------------------------------------
def _batch_problems(cfg: dict, dp: int, sizes: str, bad) -> None:
    t, m, g = (cfg.get(k) for k in BATCH_KEYS)
    if any(v is not None and not (is_int(v) and v > 0) for v in (t, m, g)):
        return  # the schema reports the value itself
    t, m, g = (None if v is None else int(v) for v in (t, m, g))
    if t is None and m is None:
        bad(("train_batch_size",), "neither train_batch_size nor train_micro_batch_size_per_gpu is given: DeepSpeed "
                                   "asserts (config.py:650)",
            f"give train_micro_batch_size_per_gpu and gradient_accumulation_steps; train_batch_size is their product "
            f"x {dp} ({sizes})")
        return
    if t is None:
        return  # DeepSpeed derives train_batch_size = micro x accumulation x dp
    # DeepSpeed's derivation of what is missing (config.py:607-650), then its assert (config.py:602).
    derived = {k for k, v in zip(BATCH_KEYS[1:], (m, g)) if v is None}
    if m is None:
        g = g or 1
        m = t // dp // g
    elif g is None:
        g = t // m // dp
    if m > 0 and g > 0 and t == m * g * dp:
        return
    keep_m, keep_g = max(1, m), max(1, g)
    fixes = [f"train_batch_size {keep_m * keep_g * dp} (= micro-batch {keep_m} x accumulation {keep_g} x dp {dp})"]
    if t % (keep_m * dp) == 0:
        fixes.append(f"gradient_accumulation_steps {t // (keep_m * dp)} (keeps train_batch_size {t})")
    elif t % dp == 0:
        fixes.append(f"train_micro_batch_size_per_gpu {t // dp} and gradient_accumulation_steps 1")
    note = f" ({', '.join(sorted(derived))} derived by DeepSpeed)" if derived else ""
    bad(("train_batch_size",), f"train_batch_size {t} != micro-batch {m} x gradient accumulation {g} x data-parallel "
                               f"size {dp} = {m * g * dp}{note}; {sizes}",
        "for this world size set " + ", or ".join(fixes))


def rule_problems(cfg: dict, *, world: int, tp: int, pp: int, cp: int, dp: int, lines: dict,
                  client_optimizer: str | None = None) -> list[Problem]:
    """The cross-field problems of ``cfg`` for the sizes given. ``client_optimizer``: the class of the optimizer the
    program passes to deepspeed.initialize, where the caller knows it (one of :data:`CLIENT_CPU_OPTIMIZERS`: no
    warning that ZeRO-Offload without an optimizer block needs one); None: unknown."""
    import torch

    out: list[Problem] = []

    def bad(parts: Parts, message: str, fix: str, severity: str = "error") -> None:
        out.append(Problem(path=json_path(parts), severity=severity, message=message, fix=fix,
                           line=line_of(lines, parts), source="rules"))

    if dp * pp * cp == world and tp > 1:  # AutoTP: DeepSpeed 0.19.8 counts the TP ranks in the batch triple
        sizes = (f"with AutoTP DeepSpeed counts the tp ranks too: dp = world {world} / (pp {pp} x cp {cp}), "
                 f"not / tp {tp} (runtime/config.py:466-471)")
    else:
        sizes = f"dp = world {world} / (tp {tp} x pp {pp} x cp {cp})"
    _batch_problems(cfg, dp, sizes, bad)
    _value_problems(cfg, bad)
    zero = cfg.get("zero_optimization")
    if zero is True:
        bad(("zero_optimization",), "the boolean form is deprecated (it means ZeRO stage 1)",
            'write "zero_optimization": {"stage": 1}', "warning")
    stage = 1 if zero is True else get(zero, ("stage",), 0)
    zero = zero if isinstance(zero, dict) else {}
    stage = int(stage) if is_int(stage) else 0
    if stage >= 2 and pp > 1:
        bad(("zero_optimization", "stage"), f"ZeRO-{stage} is incompatible with pipeline parallelism (pp {pp}): "
                                            "DeepSpeed's PipelineEngine asserts ZeRO stage < 2 (pipe/engine.py:76)",
            "use ZeRO-1 with pp > 1, or pp 1 with ZeRO-2/3")
    elif stage >= 2 and "pipeline" in cfg:
        bad(("pipeline",), f"a pipeline block with ZeRO-{stage}: if the model is a PipelineModule, DeepSpeed's "
                           "PipelineEngine asserts ZeRO stage < 2 (pipe/engine.py:76)",
            "remove the pipeline block if the model is not a PipelineModule; otherwise use ZeRO-0/1", "warning")
    devices = {}
    for name in ("offload_optimizer", "offload_param"):
        block = zero.get(name)
        devices[name] = block.get("device", "none") if isinstance(block, dict) else "none"
        if devices[name] in ("none", None):
            continue
        if name == "offload_param" and stage != 3:
            bad(("zero_optimization", name), f"offload_param needs ZeRO-3; at stage {stage} DeepSpeed ignores it "
                "(only the stage-3 optimizer reads it: runtime/engine.py:2731, 2773 of 0.19.8)",
                "set zero_optimization.stage to 3, or remove offload_param", "warning")
        if name == "offload_optimizer" and stage == 0:
            bad(("zero_optimization", name), "offload_optimizer needs ZeRO stage 1, 2 or 3; stage 0 ignores it",
                "set zero_optimization.stage to 1 or more, or remove offload_optimizer")
        if devices[name] == "nvme" and not block.get("nvme_path"):
            bad(("zero_optimization", name, "nvme_path"), f"{name} to nvme needs nvme_path: DeepSpeed fails when it "
                                                          "builds the swapper (partition_parameters.py:1225)",
                "set nvme_path to a folder on a local NVMe drive")
    if devices["offload_optimizer"] not in ("none", None) and "optimizer" not in cfg \
            and cfg.get("zero_force_ds_cpu_optimizer", True) is not False \
            and client_optimizer not in CLIENT_CPU_OPTIMIZERS:
        bad(("zero_optimization", "offload_optimizer"),
            "ZeRO-Offload with no optimizer block: the optimizer passed to deepspeed.initialize must be "
            "DeepSpeedCPUAdam (or DeepSpeedCPULion), else DeepSpeed raises ZeRORuntimeException (engine.py:2345)",
            "add an optimizer block (AdamW), pass DeepSpeedCPUAdam, or set zero_force_ds_cpu_optimizer: false",
            "warning")
    for key in ("bf16", "bfloat16"):
        if get(cfg, ("fp16", "enabled")) is True and get(cfg, (key, "enabled")) is True:
            bad((key, "enabled"), "fp16 and bf16 are both enabled: DeepSpeed asserts 'bfloat16 and fp16 modes cannot "
                                  "be simultaneously enabled' (config.py:511)",
                "enable one of them: bf16 on Ampere or newer GPUs, fp16 on older ones")
    top, zero_removed = removed_keys()
    fix = f"delete it: DeepSpeed {DEEPSPEED_VERSION} raises DeepSpeedConfigError on it"
    for key in (k for k in cfg if k in top):
        bad((key,), top[key], fix)
    for key in (k for k in zero if k in zero_removed):
        bad(("zero_optimization", key), zero_removed[key], fix)
    opt = cfg.get("optimizer") if isinstance(cfg.get("optimizer"), dict) else {}
    params, name = opt.get("params"), opt.get("type")
    if isinstance(params, dict) and "max_grad_norm" in params:
        bad(("optimizer", "params", "max_grad_norm"), "max_grad_norm is not an optimizer parameter: DeepSpeed raises "
                                                      "ValueError at deepspeed.initialize (engine.py:2481)",
            f"delete it and set the top-level gradient_clipping: {params['max_grad_norm']}")
    if isinstance(name, str) and name:
        torch_names = [n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)]
        if name.lower() not in _DS_OPTIMIZERS and name not in torch_names:
            near = close_key(name, sorted(_DS_OPTIMIZERS) + torch_names)
            bad(("optimizer", "type"), f"unknown optimizer {name!r}: neither a DeepSpeed optimizer nor a torch.optim "
                                       "class, so deepspeed.initialize fails (engine.py:2545)",
                f"did you mean {near}?" if near else "use AdamW")
        elif stage > 0 and name.lower() not in _ZERO_TESTED_OPTIMIZERS \
                and cfg.get("zero_allow_untested_optimizer") is not True:
            bad(("optimizer", "type"), f"ZeRO has not been tested with {name!r}: deepspeed.initialize asserts "
                                       "(engine.py:2298)", 'add "zero_allow_untested_optimizer": true, or use AdamW')
    sched = get(cfg, ("scheduler", "type"))
    if isinstance(sched, str) and sched and sched not in _DS_SCHEDULERS \
            and not isinstance(getattr(torch.optim.lr_scheduler, sched, None), type):
        near = close_key(sched, _DS_SCHEDULERS)
        bad(("scheduler", "type"), f"unknown scheduler {sched!r}: neither a DeepSpeed nor a torch.optim.lr_scheduler "
                                   "scheduler; deepspeed.initialize asserts (engine.py:1929)",
            f"did you mean {near}?" if near else "use WarmupCosineLR")
    autotp = get(cfg, ("tensor_parallel", "autotp_size"))
    if is_int(autotp) and autotp > 1 and autotp != tp:
        bad(("tensor_parallel", "autotp_size"), f"autotp_size {autotp} but the job's tp is {tp}",
            "make tensor_parallel.autotp_size equal to the tensor-parallel size")
    return out



def _is_number_text(text: str) -> bool:
    try:
        return math.isfinite(float(text)) and float(text) > 0
    except ValueError:
        return False


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _value_problems(cfg: dict, bad) -> None:
    """Values DeepSpeed's parser passes on unchecked to torch, which fails late or trains nothing: the optimizer's
    lr (finite, > 0; a string is a TypeError in torch), betas (two numbers in [0, 1): torch.optim.AdamW raises
    ValueError, TypeError for a string), eps (> 0), weight_decay (>= 0), the scheduler's learning rates and step counts, gradient_clipping (>= 0)."""
    params = get(cfg, ("optimizer", "params"))
    if isinstance(params, dict):
        where = ("optimizer", "params")
        lr = params.get("lr")
        if "lr" in params and not (_number(lr) and lr > 0):
            if isinstance(lr, str):  # torch compares 0.0 <= lr first: a string fails with TypeError, not ValueError
                bad(where + ("lr",), f"lr must be a number, got the string {lr!r}: torch.optim raises TypeError "
                                     "('<=' not supported between instances of 'float' and 'str') at "
                                     "deepspeed.initialize", f"write it without quotes, e.g. {lr.strip() or '3e-4'}"
                    if _is_number_text(lr) else "use e.g. 3e-4")
            else:
                bad(where + ("lr",), f"lr must be a finite number > 0, got {lr!r}: torch.optim raises "
                                     "ValueError('Invalid learning rate') at deepspeed.initialize", "use e.g. 3e-4")
        betas = params.get("betas")
        if "betas" in params and not (isinstance(betas, list) and len(betas) == 2
                                      and all(_number(b) and 0 <= b < 1 for b in betas)):
            error = ("TypeError ('<=' not supported between instances of 'float' and 'str')"
                     if isinstance(betas, list) and any(isinstance(b, str) for b in betas)
                     else "ValueError('Invalid beta parameter')")
            bad(where + ("betas",), f"betas must be two numbers in [0, 1), got {betas!r}: torch.optim.AdamW raises "
                                    f"{error}", "use [0.9, 0.95] or [0.9, 0.999]")
        if "eps" in params and not (_number(params["eps"]) and params["eps"] > 0):
            bad(where + ("eps",), f"eps must be a finite number > 0, got {params['eps']!r}", "use 1e-8")
        if "weight_decay" in params and not (_number(params["weight_decay"]) and params["weight_decay"] >= 0):
            bad(where + ("weight_decay",), f"weight_decay must be a finite number >= 0, got "
                                           f"{params['weight_decay']!r}", "use 0.1 or 0.0")
    sched = get(cfg, ("scheduler", "params"))
    if isinstance(sched, dict):
        for key, value in sched.items():
            if key.endswith("_lr") and not (_number(value) and value >= 0):
                bad(("scheduler", "params", key), f"{key} must be a finite number >= 0, got {value!r}",
                    "use a learning rate such as 3e-4 (or 0 for a minimum)")
            elif key.endswith(("_steps", "_num_steps")) and not (is_int(value) and value >= 0):
                bad(("scheduler", "params", key), f"{key} must be a whole number of steps >= 0, got {value!r}",
                    "use a step count")
    clip = cfg.get("gradient_clipping")
    if "gradient_clipping" in cfg and not (_number(clip) and clip >= 0):
        bad(("gradient_clipping",), f"gradient_clipping must be a finite number >= 0, got {clip!r}",
            "use 1.0 (0 turns clipping off)")
