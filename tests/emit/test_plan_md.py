"""plan.md: every section present, numbers from the estimate, files in the order they are used."""

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.plan_md import plan_markdown, plan_reasons
from autotune.report import memory_table
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset


def _estimate(model, gpu, num_gpus, **plan):
    m = load_model_preset(model)
    c = load_cluster(gpu=gpu, num_gpus=num_gpus)
    return estimate(m, c, make_plan(m, c, **plan))


@pytest.fixture(scope="module")
def llama405():
    # 126 layers on pp 16: 7 + 14 x 8 + 7; 2048 = 1 x 256 x dp 8.
    return _estimate("llama3-405b", "h100-sxm-80gb", 1024, tp=8, pp=16, global_batch_size=2048, zero_stage=1,
                     engine="megatron", precision="fp8", recompute="full")


def test_sections_and_numbers(llama405):
    text = plan_markdown(llama405, checkpoint_policy_text="Save every 250 steps to /ckpt (async).")
    for heading in ("# Training plan: llama3-405b on 1024 x h100-sxm-80gb", "## Model and cluster",
                    "## The plan and why", "## Memory per GPU", "## Predicted step time", "## Checkpoint policy",
                    "## How to run"):
        assert heading in text
    assert "## Measured" not in text
    e = llama405
    # The ledger table, verbatim, inside a code block.
    table = memory_table(e.model, e.cluster, e.plan, e.memory)
    assert f"```text\n{table}\n```" in text
    assert f"{e.time.tokens_per_s:,.0f} tokens/s" in text and f"MFU {e.time.mfu:.1%}" in text
    assert f"**{e.time.step_time_s:.3f}**" in text
    assert "Save every 250 steps to /ckpt (async)." in text
    assert "7 + 14 x 8 + 7 layers" in text
    assert "bubble (pp-1)/(vpp*m) = 15/(1*256)" in text
    # the figure the Megatron job logs (its own FLOP count, autotune.cost.logged_flops), beside our model FLOPs
    from autotune.cost.logged_flops import logged_tflops_per_gpu
    from autotune.report import flop_rate
    logged = logged_tflops_per_gpu(e.model, e.plan, e.time.tokens_per_s)
    assert logged is not None and logged < e.time.model_tflops_per_gpu
    assert f"Megatron-Bridge logs {flop_rate(logged)} per GPU" in text


def test_a_line_per_dimension(llama405):
    dims = [d for d, _, _ in plan_reasons(llama405)]
    for d in ("tensor parallel", "pipeline parallel", "data parallel", "sequence parallel", "ZeRO / sharding", "micro-batch",
              "recompute", "precision", "attention", "overlap"):
        assert d in dims
    text = plan_markdown(llama405)
    for d in dims:
        assert f"| {d} |" in text
    assert "context parallel" not in dims and "expert parallel" not in dims


def test_moe_and_context_parallel_rows():
    moe = _estimate("mixtral-8x7b", "h100-sxm-80gb", 64, tp=1, ep=8, global_batch_size=256, zero_stage=1,
                    engine="megatron")
    rows = {d: (s, w) for d, s, w in plan_reasons(moe)}
    assert rows["expert parallel"][0] == "8" and "1 of 8 experts per GPU" in rows["expert parallel"][1]
    cp = _estimate("llama3-8b", "h100-sxm-80gb", 16, tp=2, pp=2, cp=2, global_batch_size=32, engine="megatron",
                   seq_len=8192)
    rows = {d: (s, w) for d, s, w in plan_reasons(cp)}
    assert "4096 per GPU" in rows["context parallel"][1]


def test_measured_numbers_are_compared(llama405):
    measured = {"step_time_s": llama405.time.step_time_s * 1.1, "tokens_per_s": 200_000.0,
                "peak_memory_bytes": 60 * 2**30, "status": "ok"}
    text = plan_markdown(llama405, measured=measured)
    section = text.split("## Measured", 1)[1].split("##", 1)[0]
    assert "| step_time_s |" in section and "| 1.10 |" in section
    assert "60.00 GiB" in section and "| status | | ok | |" in section


def test_files_in_the_order_they_are_used(llama405):
    files = ["launch_slurm.sbatch", "megatron_args.txt", "plan.md", "launch_torchrun.sh", "checkpoint_policy.json"]
    run = plan_markdown(llama405, files=files).split("## How to run", 1)[1]
    assert run.index("megatron_args.txt") < run.index("launch_slurm.sbatch")
    assert run.index("checkpoint_policy.json") < run.index("launch_torchrun.sh")
    assert "`sbatch launch_slurm.sbatch`" in run and "plan.md" not in run
    assert "(no files were written" in plan_markdown(llama405).split("## How to run", 1)[1]


def test_user_text_cannot_break_the_table():
    e = _estimate("llama3-8b", "h100-sxm-80gb", 8, tp=2, global_batch_size=8, engine="megatron")
    text = plan_markdown(e, measured={"odd|key": 1.0})
    assert "odd\\|key" in text
