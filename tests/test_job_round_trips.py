"""Files an FSDP bundle writes only for the plan they run, and a plan.json read back with the release it was
written for: sibling round-trip checks of ``test_job_files`` (its CLI runner and base flags)."""

from __future__ import annotations

import json

import pytest
from test_job_files import BASE, run  # tests/ is on sys.path: the --from tests' CLI runner


@pytest.mark.parametrize("flags, unwritten, why", [
    (["--tp", "2", "--sequence-parallel"], "accelerate_fsdp.yaml", "sequence"),
    (["--tp", "2", "--no-sequence-parallel"], "torchtitan_job.toml", "sequence"),
    (["--optimizer", "sgd"], "torchtitan_job.toml", "optimizer sgd")])
def test_an_fsdp_file_that_would_run_another_plan_is_not_written(flags, unwritten, why, tmp_path, capsys):
    """accelerate's TP (the model's transformers tp_plan) replicates the norms; torchtitan 0.2's always shards them
    over the sequence; torchtitan builds AdamW whatever the plan's optimizer: each file is written only for the plan
    it runs (each was written, and read back as another plan)."""
    code, _, err = run(["emit", *BASE, "--engine", "fsdp", *flags, "--torchtitan-version", "0.2",
                        "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    assert not (tmp_path / "job" / unwritten).exists()
    assert f"{unwritten} is not written: {why}" in (tmp_path / "job" / "plan.md").read_text()


def test_a_torchtitan_03_plan_json_reads_back_with_its_release(tmp_path, capsys):
    """plan.json records the release it was written for: torchtitan 0.3's per-op SAC save set is estimated from it
    (it was not: a 0.3 FP8 bundle's plan.json read back with 0.2's, another step time and memory)."""
    flags = [*BASE, "--engine", "fsdp", "--precision", "fp8"]
    code, _, err = run(["emit", *flags, "--torchtitan-version", "0.3", "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    written = json.loads((tmp_path / "job" / "plan.json").read_text())
    code, out, err = run(["estimate", *flags, "--engine-version", "fsdp=0.3", "--json"], capsys)
    assert code == 0, err
    before = json.loads(out)
    code, out, err = run(["estimate", "--from", tmp_path / "job" / "plan.json", "--json"], capsys)
    assert code == 0, err
    after = json.loads(out)
    for doc in (written, after):
        assert doc["time"]["step_time_s"] == pytest.approx(before["time"]["step_time_s"], rel=1e-9)
        assert doc["memory"]["total"] == pytest.approx(before["memory"]["total"], rel=1e-9)


def test_a_te_fp8_recipe_module_that_is_not_a_regular_file_is_refused_not_waited_on(tmp_path, capsys):
    """te_fp8_recipe.py is read back by its name; a FIFO so named blocked `estimate --from` for ever (read with
    Path.read_text): it is read as every input file is (autotune.inputs.read_text), and refused by name."""
    import os

    from test_job_files import GPU, JOBS

    fifo = tmp_path / "te_fp8_recipe.py"
    os.mkfifo(fifo)
    code, out, err = run(["estimate", "--from", JOBS / "ds_config_zero3.json", fifo, "--model", "llama3-8b", *GPU],
                         capsys)
    assert code == 2 and out == "" and "FIFO" in err and "give a regular file" in err
