"""`autotune estimate`'s opt-in run-settings line (autotune.search.setting_gains.plan_setting_gains).

- the best combination on the estimated plan itself, of the settings the command line left open; `estimate` with
  the suggested flags gives exactly the suggested tokens/s;
- a setting the command line (or the job's files) set is never suggested;
- a mixture of experts: NVIDIA's MoE bundle (full-iteration graph, HybridEP, EP overlap with delayed wgrad, TP
  userbuffers) is among the combinations, on the same plan;
- `estimate --json` records it as `plan --json` does; nothing where nothing gains.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from autotune.cli import main
from autotune.search.setting_gains import MIN_GAIN

LINE = "opt-in run settings (not searched: each changes how the job runs): this plan with "
DENSE = ["--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--tp", "8", "--pp", "2", "--zero",
         "1", "--micro-batch", "1", "--global-batch", "512", "--seq-len", "8192", "--recompute", "selective",
         "--engine", "megatron"]
MOE = ["--model", "qwen3-30b-a3b", "--gpu", "gb200", "--num-gpus", "64", "--seq-len", "4096", "--global-batch", "512",
       "--engine", "megatron", "--tp", "2", "--ep", "8", "--micro-batch", "1", "--precision", "fp8", "--fp8-recipe",
       "te-mxfp8", "--grad-dtype", "bf16"]
JOB = ["--model", "deepseek-v3", "--gpu", "gb200", "--num-gpus", "256", "--gpus-per-node", "64"]


def _run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def _estimate(argv: list[str]) -> tuple[str, dict]:
    """(the text `estimate` prints, its --json document)."""
    return _run("estimate", *argv), json.loads(_run("estimate", *argv, "--json"))


def _line(text: str) -> str | None:
    return next((ln for ln in text.splitlines() if ln.startswith("opt-in run settings")), None)


def _reproduced(argv: list[str], gains: dict) -> None:
    """`estimate` with the suggested flags added: the suggested plan and exactly the suggested tokens/s."""
    again = json.loads(_run("estimate", *argv, *gains["flags"], "--json"))
    assert again["time"]["tokens_per_s"] == gains["tokens_per_s"]
    assert again["plan"] == gains["plan"]


def test_dense_plan_says_what_the_settings_gain_and_the_flags_give_it():
    text, doc = _estimate(DENSE)
    gains = doc["setting_gains"]
    assert gains["scope"] == "this plan" and gains["gain"] >= MIN_GAIN
    assert gains["tokens_per_s"] == pytest.approx(doc["time"]["tokens_per_s"] * (1 + gains["gain"]), rel=1e-12)
    # the same plan, only its run settings changed
    assert {k: v for k, v in gains["plan"].items() if k not in gains["settings"]} == doc["plan"]
    line = _line(text)
    assert line == (f"{LINE}{' '.join(gains['flags'])}: {gains['tokens_per_s']:,.0f} tokens/s, "
                    f"{gains['gain']:+.1%}")
    _reproduced(DENSE, gains)


def test_json_has_the_shape_of_plans():
    _, doc = _estimate(DENSE)
    plan_doc = json.loads(_run("plan", "--model", "qwen3-30b-a3b", "--gpu", "b200", "--num-gpus", "8", "--seq-len",
                               "4096", "--global-batch", "512", "--precision", "fp8", "--json"))
    assert doc["setting_gains"] is not None and plan_doc["setting_gains"] is not None
    assert set(doc["setting_gains"]) == set(plan_doc["setting_gains"])


@pytest.mark.parametrize("flag", ["--tp-overlap", "--cuda-graph"])
def test_a_setting_the_user_set_is_never_suggested(flag):
    open_, _ = _estimate(MOE)
    assert f" {flag} " in _line(open_)  # suggested while open
    text, doc = _estimate([*MOE, flag, "none"])
    assert doc["plan"][flag[2:].replace("-", "_")] == "none"
    gains = doc["setting_gains"]
    assert gains is None or flag not in gains["flags"]
    assert flag not in (_line(text) or "")


def test_moe_plan_gets_nvidias_bundle_on_the_same_plan():
    text, doc = _estimate(MOE)
    gains = doc["setting_gains"]
    assert gains["settings"] == {"cuda_graph": "full-iteration", "tp_overlap": "userbuffers",
                                 "moe_dispatcher": "flex-hybridep", "ep_overlap": "a2a-delay-wgrad"}
    assert gains["scope"] == "this plan" and gains["gain"] >= MIN_GAIN
    for dim in ("tp", "pp", "ep", "dp", "micro_batch_size"):  # no other layout
        assert gains["plan"][dim] == doc["plan"][dim]
    assert "--moe-dispatcher flex-hybridep" in _line(text)
    _reproduced(MOE, gains)


def test_nothing_where_nothing_gains():
    # an engine with no opt-in setting
    text, doc = _estimate(["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "hf"])
    assert doc["setting_gains"] is None and _line(text) is None
    # a plan that already runs every setting that gains (the README's DeepSeek-V3 recipe, NVIDIA's bundle; tp=1)
    _, with_bundle = _estimate([*JOB, "--seq-len", "4096", "--global-batch", "4096", "--engine", "megatron", "--pp",
                                "4", "--vpp", "4", "--ep", "64", "--micro-batch", "1", "--precision", "fp8",
                                "--fp8-recipe", "te-mxfp8", "--grad-dtype", "bf16", "--mtp-layers", "1", "--recompute",
                                "selective", "--recompute-modules", "mla_up_proj", "--cuda-graph", "full-iteration",
                                "--ep-overlap", "a2a-delay-wgrad", "--moe-dispatcher", "flex-hybridep"])
    assert with_bundle["setting_gains"] is None


def test_estimate_from_a_job_keeps_its_settings(tmp_path):
    """`estimate --from` the job's own files: what the job sets is kept, what it leaves open suggested."""
    _run("emit", *JOB, "--seq-len", "4096", "--global-batch", "4096", "--engine", "megatron", "--pp", "4", "--vpp",
         "4", "--ep", "64", "--micro-batch", "1", "--precision", "fp8", "--fp8-recipe", "te-mxfp8", "--grad-dtype",
         "bf16", "--mtp-layers", "1", "--zero", "1", "--recompute", "selective", "--recompute-modules", "mla_up_proj",
         "--moe-dispatcher", "flex-hybridep", "--out", str(tmp_path / "job"))
    argv = ["--from", str(tmp_path / "job" / "megatron_args.sh"), *JOB]
    text, doc = _estimate(argv)
    gains = doc["setting_gains"]
    assert doc["plan"]["moe_dispatcher"] == "flex-hybridep"
    assert gains["gain"] >= MIN_GAIN and "--moe-dispatcher" not in gains["flags"]  # the job set it: kept
    assert gains["settings"].get("ep_overlap") == "a2a-delay-wgrad" and " ".join(gains["flags"]) in _line(text)
    _reproduced(argv, gains)
