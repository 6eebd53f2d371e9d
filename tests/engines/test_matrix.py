"""docs/engines.md is the engines' own support data, never hand-edited."""

from pathlib import Path

from autotune.engines import ENGINES
from autotune.engines.matrix import support_markdown, support_rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "engines.md"


def test_doc_is_current():
    assert DOC.read_text(encoding="utf-8") == support_markdown(), "run: python -m autotune.engines.matrix > docs/engines.md"


def test_matrix_says_what_the_issue_requires():
    cells = dict(support_rows())
    names = list(ENGINES)
    col = {n: i for i, n in enumerate(names)}
    # Plain DeepSpeed: no Megatron SP, AutoTP not with PipelineModule, Ulysses as its CP, uneven PipelineModule split.
    assert cells["Megatron sequence parallel"][col["deepspeed"]] == "no"
    assert cells["tp with pp"][col["deepspeed"]] == "no"
    assert cells["context parallel"][col["deepspeed"]] == "ulysses"
    assert cells["uneven layer split"][col["deepspeed"]] == "uniform"
    # FSDP2 has no ZeRO-1; Megatron-LM runs ZeRO-2/3 as Megatron-FSDP (optim_grads / optim_grads_params).
    assert "1" not in cells["ZeRO / sharding stages"][col["fsdp"]].split(", ")
    assert cells["ZeRO / sharding stages"][col["megatron"]] == "0, 1, 2, 3"
    assert cells["hybrid sharding"][col["fsdp"]] == "yes"
