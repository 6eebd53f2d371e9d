"""The training script a Megatron-LM launch line runs, and the flags it adds to Megatron-core's parser.

``pretrain(..., extra_args_provider=...)`` lets a training script add flags of its own (megatron/training/
arguments.py ``parse_args``). Two of Megatron-LM's own scripts do (tables read from core_v0.19.0 by
scripts/extract_flag_table.py --provider):

* ``pretrain_gpt.py`` and ``pretrain_hybrid.py`` (which ``pretrain_mamba.py`` runs) add Model Optimizer's
  (megatron/post_training/arguments.py ``add_modelopt_args``) where nvidia-modelopt is installed (pretrain_gpt.py:513,
  pretrain_hybrid.py:459: ``extra_args_provider=add_modelopt_args if has_nvidia_modelopt``):
  they parse there, and the linter says they need that package;
* ``examples/multimodal/train.py`` adds its vision-language flags (examples/multimodal/multimodal_args.py
  ``add_multimodal_extra_args``): they parse there.

Any other script (a user's own ``train.py``) may add flags autotune cannot know: an unknown flag there is a warning
naming the script, not the parser exit it is for ``pretrain_gpt.py``.
"""

from __future__ import annotations

import functools
from pathlib import PurePosixPath

from autotune.emit.megatron_flags import FlagSpec, packaged_flag_table

__all__ = ["ScriptFlags", "script_flags", "GPT_SCRIPTS", "unmodelled_job"]

GPT_SCRIPTS = ("pretrain_gpt.py", "pretrain_mamba.py", "pretrain_hybrid.py")
"""Megatron-LM's language-model training scripts: Megatron-core's parser and Model Optimizer's (where installed)."""


class ScriptFlags:
    """What a training script's parser holds beyond Megatron-core's: ``table`` (flag -> spec), ``conditional`` (the
    warning a flag of it gets: parsed only where a package is installed), ``open`` (the script may add flags nobody
    listed: an unknown one is a warning)."""

    def __init__(self, table: dict[str, FlagSpec], conditional: str | None, open_: bool) -> None:
        self.table, self.conditional, self.open = table, conditional, open_


def _multimodal(path: PurePosixPath) -> bool:
    """Megatron-LM's examples/multimodal/train.py (run as that path, however the launch line reaches it)."""
    return path.name == "train.py" and path.parent.name == "multimodal"


@functools.cache
def _provider(name: str) -> dict[str, FlagSpec]:
    return packaged_flag_table(f"megatron_flags_{name}_core_v0.19.json")


def script_flags(script: str | None) -> ScriptFlags:
    """The flags ``script`` (the launch line's training script; None: no launch line, a bare argument list) adds."""
    name = "pretrain_gpt.py" if script is None else PurePosixPath(script).name
    if name in GPT_SCRIPTS:  # pretrain_hybrid.py:459 too (pretrain_mamba.py runs it: pretrain_mamba.py:19)
        return ScriptFlags(_provider("modelopt"), f"{name} adds it only where nvidia-modelopt is installed "
                           "(megatron/post_training/arguments.py add_modelopt_args)", False)
    path = PurePosixPath(script)
    if _multimodal(path):
        return ScriptFlags(_provider("multimodal"), None, False)
    return ScriptFlags({}, None, path.name not in GPT_SCRIPTS)


_OTHER_MODELS = {"pretrain_vlm.py": "a vision-language model", "pretrain_bert.py": "BERT", "pretrain_t5.py": "T5",
                 "pretrain_retro.py": "RETRO", "pretrain_ict.py": "an ICT retriever",
                 "pretrain_vision_classify.py": "a vision transformer", "pretrain_vision_dino.py": "a vision transformer",
                 "pretrain_vision_inpaint.py": "a vision transformer"}
"""Megatron-LM's training scripts of models other than a decoder language model (the repository's top level)."""


def unmodelled_job(script: str | None) -> str | None:
    """What ``script`` trains where that is no decoder language model autotune models (None: it may be one)."""
    if script is None:
        return None
    path = PurePosixPath(script)
    if _multimodal(path):
        return "a vision-language model (examples/multimodal: a vision encoder, a projection and a language model)"
    if path.name == "train.py" and path.parent.name == "mimo":  # examples/mimo/train.py: model_providers/*.py
        return "a multimodal model (examples/mimo: a MimoModel, modality encoders and projections around a language " \
            "model)"
    if path.parent.name == "tasks" and path.name == "main.py":  # Megatron's tasks/main.py (GLUE, RACE, zero-shot)
        return "a downstream task (Megatron's tasks/main.py: fine-tuning or evaluation on GLUE, RACE, zero-shot sets)"
    if path.parent.name == "eval_harness":  # Megatron-DeepSpeed's tasks/eval_harness/evaluate.py
        return "an evaluation (lm-eval-harness over a checkpoint: no training step)"
    return _OTHER_MODELS.get(path.name)
