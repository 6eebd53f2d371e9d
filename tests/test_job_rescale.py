"""`plan --from FILES --num-gpus N` / `emit --from FILES --best --num-gpus N` where the files state another world
size: the job read at its own size (its model, global batch, sequence, engine, precision) and planned on N GPUs of
the same kind (autotune.commands.from_job.job_and_search_cluster)."""

from __future__ import annotations

import json

import pytest

from test_job_files import GPU, JOBS, run  # tests/ is on sys.path: the --from tests' CLI runner and job files

ARGS = JOBS / "megatron_args_llama3_70b.sh"  # a torchrun line of 8 nodes x 8: 64 GPUs


def job_batch(got: dict) -> int:
    return got["current"]["plan"]["global_batch_size"]


def test_plan_from_a_64_gpu_job_on_128_gpus(capsys):
    code, out, err = run(["plan", "--from", ARGS, *GPU, "--num-gpus", "128", "--top-k", "3", "--json"], capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["num_gpus"] == {"job": 64, "planned": 128}
    assert got["current"]["cluster"]["num_gpus"] == 64 and got["current_rank"] is None and got["tied"] is False
    # the planner's first plan on the job's own 64 GPUs: how much of the speed-up is the plan, how much the scale
    assert got["best_on_job_gpus"]["cluster"]["num_gpus"] == 64
    assert got["best_on_job_gpus"]["plan"]["global_batch_size"] == job_batch(got)
    job = got["current"]["plan"]
    for cand in got["search"]["candidates"]:
        p = cand["plan"]
        assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == 128
        assert (p["global_batch_size"], p["seq_len"], p["engine"], p["precision"]) == (
            job["global_batch_size"], job["seq_len"], job["engine"], job["precision"])
    assert "the job runs on 64 GPUs (its files); planning it on 128 (--num-gpus)" in err


def test_plan_from_rescaled_says_the_speed_up_and_its_share_of_linear(capsys):
    code, out, err = run(["plan", "--from", ARGS, *GPU, "--num-gpus", "128", "--top-k", "1"], capsys)
    assert code == 0, err
    assert "planned on 128 GPUs (--num-gpus) instead of its 64" in out
    line = next(x for x in out.splitlines() if x.startswith("speed-up x"))
    assert "for x2.00 the GPUs" in line and "the plan change alone gives" in line and "of linear" in line
    assert "its rank among" not in out  # the job is not among plans of another size


def test_emit_best_on_more_gpus_writes_plan_froms_first(tmp_path, capsys):
    code, out, err = run(["plan", "--from", ARGS, *GPU, "--num-gpus", "128", "--top-k", "1", "--json"], capsys)
    assert code == 0, err
    first = json.loads(out)["search"]["candidates"][0]["plan"]
    code, _, err = run(["emit", "--from", ARGS, *GPU, "--num-gpus", "128", "--best", "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    written = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert written["plan"] == first and written["cluster"]["num_gpus"] == 128
    assert "on 128 GPUs" in err and "on 64)" in err


def test_num_gpus_the_files_leave_out_is_the_jobs_own_size(capsys):
    # a DeepSpeed config states no world size: --num-gpus is the job's, and the job is ranked among its alternatives
    argv = ["plan", "--from", JOBS / "ds_config_zero3.json", "--model", "llama3-8b", *GPU, "--num-gpus", "32",
            "--seq-len", "4096", "--top-k", "2", "--json"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["num_gpus"] == {"job": 32, "planned": 32} and "planning it on" not in err


def test_the_same_size_is_no_rescale_and_a_size_no_node_holds_is_refused(capsys):
    code, out, err = run(["plan", "--from", ARGS, *GPU, "--num-gpus", "64", "--top-k", "1", "--json"], capsys)
    assert code == 0 and json.loads(out)["num_gpus"] == {"job": 64, "planned": 64} and "planning it on" not in err
    code, _, err = run(["plan", "--from", ARGS, *GPU, "--num-gpus", "100"], capsys)
    assert code == 2 and "num_gpus (100) is not a multiple of gpus_per_node (8)" in err


def test_estimate_keeps_the_files_world_size_and_names_the_way_to_rescale(capsys):
    code, _, err = run(["estimate", "--from", ARGS, *GPU, "--num-gpus", "128"], capsys)
    assert code == 2 and "--num-gpus 128 but the files state 64 GPUs" in err
    assert "`plan --from`, `emit --from --best` and `tune --from` with --num-gpus plan the job on that many" in err


def test_the_search_limits_hold_on_both_sizes(capsys):
    # --tp 4 limits the plans on 128 GPUs and the planner's first plan on the job's own 64 that the speed-up is
    # split by (the job itself runs tp 8)
    code, out, err = run(["plan", "--from", ARGS, *GPU, "--num-gpus", "128", "--tp", "4", "--top-k", "2", "--json"],
                         capsys)
    assert code == 0, err
    got = json.loads(out)
    assert {c["plan"]["tp"] for c in got["search"]["candidates"]} == {4}
    assert got["best_on_job_gpus"]["plan"]["tp"] == 4 and got["current"]["plan"]["tp"] == 8


def test_a_plan_json_states_its_job_and_flags_that_disagree_are_named(tmp_path, capsys):
    """autotune's plan.json states the whole job: `--gpu b200` on a plan for H100s was dropped in silence (the H100 job
    estimated); now each disagreeing flag is named (exit 2), the same value passes, and --num-gpus still rescales
    the job on its own GPU (it needed --gpu before: "no GPU given")."""
    code, _, err = run(["emit", "--from", ARGS, *GPU, "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    plan = tmp_path / "job" / "plan.json"
    code, _, err = run(["estimate", "--from", plan, "--gpu", "b200"], capsys)
    assert code == 2 and f"--gpu b200 but {plan} states h100-sxm-80gb: drop --gpu" in err, err
    assert "give the flags without --from" in err
    code, _, err = run(["estimate", "--from", plan, *GPU, "--seq-len", "8192"], capsys)
    assert code == 0 and "what-if" not in err, err  # what the file states, given again


def test_seq_len_and_global_batch_are_what_ifs_over_a_plan_json(tmp_path, capsys):
    """--seq-len / --global-batch over a plan.json estimate its plan at that sequence and batch, as over every other
    job file (they were refused): the same splits, the accumulation derived again, the throughput the plan's own
    with those flags; a batch its interleaved schedule cannot split is named with the rule's words (exit 2)."""
    code, _, err = run(["emit", "--from", ARGS, *GPU, "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    plan = tmp_path / "job" / "plan.json"
    code, out, err = run(["estimate", "--from", plan, "--seq-len", "4096", "--global-batch", "64", "--json"], capsys)
    assert code == 0 and f"{plan}'s plan at --seq-len 4,096 and --global-batch 64 (a what-if" in err, err
    got = json.loads(out)
    stated = json.loads(plan.read_text())["plan"]
    assert (got["plan"]["seq_len"], got["plan"]["global_batch_size"]) == (4096, 64)
    assert got["plan"]["grad_accum_steps"] == 64 // (stated["dp"] * stated["micro_batch_size"])
    assert {k: got["plan"][k] for k in ("tp", "pp", "vpp", "dp")} == {k: stated[k] for k in ("tp", "pp", "vpp", "dp")}
    code, direct, err = run(["estimate", "--from", ARGS, *GPU, "--seq-len", "4096", "--global-batch", "64", "--json"],
                            capsys)  # the job file the plan was emitted from, with the same what-ifs
    assert code == 0, err
    assert got["time"]["tokens_per_s"] == pytest.approx(json.loads(direct)["time"]["tokens_per_s"], rel=1e-9)
    assert got["memory"]["total"] == pytest.approx(json.loads(direct)["memory"]["total"], rel=1e-9)
    code, _, err = run(["estimate", "--from", plan, "--global-batch", "100"], capsys)
    assert code == 2 and f"{plan}'s plan at --global-batch 100: interleaved schedule needs micro-batches" in err, err
    code, out, err = run(["plan", "--from", plan, "--num-gpus", "128", "--top-k", "1", "--json"], capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["num_gpus"] == {"job": 64, "planned": 128}
    assert got["search"]["candidates"][0]["cluster"]["gpu"] == "h100-sxm-80gb"


def test_a_job_planned_on_too_few_gpus_hears_how_many_it_needs(capsys):
    """The 70B job on 8 GPUs: no plan fits. `plan --from` said only what pruned the plans; it now gives the way out
    `plan` gives (the GPU count the model needs under the job's engine and precision)."""
    code, out, err = run(["plan", "--from", ARGS, *GPU, "--num-gpus", "8"], capsys)
    assert code == 2 and "no plan of the" in err
    assert "llama3-70b at seq_len 8192 needs at least" in err
