"""The CLI contract: --json fields, tables, exit codes, every problem named, no tracebacks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main

ESTIMATE_70B = ["estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--tp", "8",
                "--pp", "2", "--zero", "1", "--micro-batch", "1", "--global-batch", "512", "--seq-len", "8192",
                "--recompute", "selective", "--engine", "megatron"]
CONTRACT = {
    "model": {"name", "num_params"},
    "cluster": {"gpu", "num_gpus", "gpus_per_node"},
    "plan": {"tp", "pp", "vpp", "dp", "cp", "ep", "sequence_parallel", "zero_stage", "micro_batch_size",
             "grad_accum_steps", "global_batch_size", "seq_len", "recompute", "precision", "offload_optimizer",
             "offload_param"},
    "memory": {"weights", "gradients", "optimizer_states", "activations", "buffers", "overhead", "total", "capacity",
               "fits", "host_per_node"},
    "time": {"step_time_s", "compute_s", "exposed_comm_s", "bubble_s", "offload_s", "optimizer_s", "tokens_per_s",
             "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"},
}


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def check_contract(doc):
    for block, keys in CONTRACT.items():
        assert keys <= set(doc[block]), (block, keys - set(doc[block]))


def test_estimate_json_matches_the_contract(capsys):
    code, out, err = run(ESTIMATE_70B + ["--json"], capsys)
    assert code == 0 and err == ""
    doc = json.loads(out)  # nothing but JSON on stdout
    check_contract(doc)
    assert doc["plan"]["dp"] == 4 and doc["plan"]["grad_accum_steps"] == 128
    m = doc["memory"]
    terms = sum(m[k] for k in ("weights", "gradients", "optimizer_states", "activations", "buffers", "overhead"))
    assert abs(terms - m["total"]) <= 6  # rounding of six terms to whole bytes
    assert m["fits"] is True and 0 < doc["time"]["mfu"] < 1


def test_estimate_table(capsys):
    code, out, _ = run(ESTIMATE_70B, capsys)
    assert code == 0
    for term in ("weights", "gradients", "optimizer states", "activations", "buffers", "overhead", "capacity"):
        assert term in out
    assert "#" in out and "fits: yes" in out


def test_plan_json_matches_the_contract(capsys):
    code, out, _ = run(["plan", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "128",
                        "--seq-len", "8192", "--global-batch", "1024", "--json", "--top-k", "3"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert {"candidates", "num_enumerated", "num_feasible", "rejections", "search_time_s"} <= set(doc)
    assert len(doc["candidates"]) == 3
    for cand in doc["candidates"]:
        check_contract(cand)
    tps = [c["time"]["tokens_per_s"] for c in doc["candidates"]]
    # plans tied with the fastest (within the model's error) come simplest first; the rest by predicted speed
    tied, rel = doc["tied_with_first"], doc["uncertainty"]["relative"]
    assert tps[tied:] == sorted(tps[tied:], reverse=True)
    assert all(t >= max(tps) * (1 - 2 * rel) for t in tps[:tied])
    assert doc["num_enumerated"] == doc["num_feasible"] + sum(doc["rejections"].values())


def test_every_problem_at_once_and_exit_2(capsys):
    code, out, err = run(["estimate", "--model", "llama3-70", "--gpu", "h100", "--num-gpus", "0",
                          "--micro-batch", "0"], capsys)
    assert code == 2 and out == ""
    for needle in ("--num-gpus must be >= 1 and <= 1,048,576", "--micro-batch", "did you mean llama3-70b",
                   "did you mean h100-pcie-80gb, h100-sxm-80gb"):
        assert needle in err
    assert "Traceback" not in err


@pytest.mark.slow  # half a minute of plan searches
def test_impossible_request_says_what_would_work(capsys):
    code, out, err = run(["plan", "--model", "llama3-405b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8",
                          "--seq-len", "8192"], capsys)
    assert code == 2 and out == ""
    assert "no plan of the" in err and "needs at least" in err and "without offload" in err


def test_min_gpus_takes_no_gpu_count(capsys):
    code, _, err = run(["plan", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--min-gpus"],
                       capsys)
    assert code == 2 and "drop --num-gpus" in err
    code, _, err = run(["plan", "--model", "llama3-70b", "--min-gpus"], capsys)
    assert code == 2 and "give --gpu (or --cluster FILE)" in err and "--num-gpus" not in err


def test_min_gpus_and_max_model(capsys):
    code, out, _ = run(["plan", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb",
                        "--seq-len", "4096", "--min-gpus", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    # 70B x 16 B/param = 1.13 TB of states: without offload more than 1.13e12 / 85.5e9 = 14 GPUs are needed.
    assert doc["without_offload"] >= 16
    assert doc["with_offload"] <= doc["without_offload"]
    code, out, _ = run(["plan", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "4096", "--max-model",
                        "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["binding_limit"] in ("memory", "bandwidth")
    assert 1e9 < doc["num_params"] < doc["next_size"]["num_layers"] * 1e12


@pytest.mark.slow
def test_console_script_runs_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "autotune", "estimate", "--model", "nope", "--gpu", "a100-80gb",
                           "--num-gpus", "8"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "nope" in proc.stderr


def test_calibration_file_changes_the_prediction(tmp_path, capsys):
    from autotune.cost.efficiency import DEFAULT_EFFICIENCY, save_efficiency

    path = tmp_path / "cal.json"
    save_efficiency(DEFAULT_EFFICIENCY.with_(gemm_peak_fraction=DEFAULT_EFFICIENCY.gemm_peak_fraction / 2), str(path))
    base = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--json"]
    assert main(base) == 0
    default = json.loads(capsys.readouterr().out)["time"]["step_time_s"]
    assert main(base + ["--calibration", str(path)]) == 0
    slower = json.loads(capsys.readouterr().out)["time"]["step_time_s"]
    assert slower > 1.3 * default  # half the GEMM efficiency: GEMMs dominate the step
    path.write_text('{"gemm_peak_fraction": -1, "bogus": 1}')
    assert main(base + ["--calibration", str(path)]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "gemm_peak_fraction must be a positive number" in err


def _all_parsers():
    import argparse

    from autotune.cli import build_parser

    parser = build_parser()
    yield "autotune", parser
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    yield from ((f"autotune {name}", p) for name, p in sub.choices.items())


def test_every_flag_of_every_subcommand_has_help():
    import argparse

    missing = [f"{prog} {'/'.join(a.option_strings) or a.dest}" for prog, parser in _all_parsers()
               for a in parser._actions
               if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert not missing, missing


def test_version_and_recipes_without_an_action(capsys):
    import autotune

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"autotune {autotune.__version__}"
    code, out, err = run(["recipes"], capsys)
    assert code == 0 and "cpu-demo" in out and err == ""


def test_help_autotune_shows_the_api():
    import pydoc

    import autotune

    text = pydoc.render_doc(autotune, renderer=pydoc.plaintext)
    for name in ("load_model", "load_cluster", "make_plan", "estimate", "search_plans", "deepspeed_config",
                 "write_bundle", "InputError"):
        assert name in text, name
    assert set(autotune.__all__) <= set(dir(autotune))


def test_estimate_prints_the_step_time_breakdown_and_a_legend(capsys):
    code, out, _ = run(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--tp", "2",
                        "--pp", "2", "--engine", "megatron"], capsys)
    assert code == 0
    assert "step time per optimizer step" in out and "pipeline bubble" in out and "tokens/s" in out
    assert "legend: " in out and "mcore-distopt = " in out and "mbMxA = " in out
    assert "share: of the total" in out and " used" in out


def test_plan_table_has_a_legend_and_rule_meanings(capsys):
    # tiny-gpt's learned position table has 512 rows: the default --seq-len 4096 is refused (seq_positions).
    code, out, _ = run(["plan", "--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "512",
                        "--top-k", "2"], capsys)
    assert code == 0
    assert "legend: " in out and "columns: " in out and "other = offload transfers" in out
    assert "rules: " in out and "batch_triple" in out or "layers_vpp =" in out


def test_json_output_is_standard_json(capsys, monkeypatch):
    from autotune.cost import step_time

    real = step_time.estimate_step_time

    def infinite(*args, **kwargs):  # an unbounded time (a zero bandwidth) must not print Infinity
        from dataclasses import replace

        return replace(real(*args, **kwargs), offload_s=float("inf"))

    monkeypatch.setattr("autotune.cost.estimate.estimate_step_time", infinite)
    code, out, _ = run(["estimate", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64",
                        "--json"], capsys)
    assert code == 0 and "Infinity" not in out
    assert json.loads(out)["time"]["offload_s"] is None


@pytest.mark.parametrize("argv, needle", [
    (["--overhead-gib", "-100"], "--overhead-gib must be >= 0"),
    (["--overhead-gib", "nan"], "--overhead-gib must be a finite number"),
    (["--fragmentation", "1e12"], "--fragmentation must be >= 0 and <= 0.9"),
    (["--num-gpus", str(10**12)], "<= 1,048,576"),
    (["--seq-len", str(10**30)], "--seq-len must be"),
])
def test_numbers_are_checked_for_range_and_finiteness(argv, needle, capsys):
    code, out, err = run(["estimate", "--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", *argv],
                         capsys)
    assert code == 2 and out == "" and needle in err and "Traceback" not in err


def test_plan_rejects_nonsense_thresholds(capsys):
    base = ["plan", "--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8"]
    for flag, value in (("--min-headroom-gib", "nan"), ("--min-mfu", "1.5"), ("--min-mfu", "-1")):
        code, _, err = run(base + [flag, value], capsys)
        assert code == 2 and flag in err, (flag, value, err)


def test_ctrl_c_during_emit_exits_130_without_a_traceback(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("autotune.bundle.writer.write_bundle", interrupted)
    code, out, err = run(["emit", "--recipe", "cpu-demo", "--out", str(tmp_path / "job")], capsys)
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("recipe_emit, needle", [
    ({"launch": {"master_port": "x"}}, "emit.launch.master_port: expected an integer"),
    ({"launch": {"nccl_env": [1]}}, "emit.launch.nccl_env: expected a mapping"),
    ({"launch": {"job_name": 5}}, "emit.launch.job_name: expected a string"),
    ({"launch": {"hosts": "ab"}}, "emit.launch.hosts: expected a list"),
    ({"launch": {"script_args": "--foo bar"}}, "emit.launch.script_args: expected a list"),
    ({"launch": {"script": "--help"}}, "must not be empty or start with '-'"),
    ({"optimizer": {"betas": ["a", "b"]}}, "emit.optimizer.betas[0]: expected a number"),
])
def test_recipe_emit_block_is_type_checked(recipe_emit, needle, tmp_path, capsys):
    import yaml

    from autotune import resources

    recipe = yaml.safe_load((resources.recipes_dir() / "cpu-demo.yaml").read_text()) | {"emit": recipe_emit}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    code, _, err = run(["emit", "--recipe", str(path), "--out", str(tmp_path / "job")], capsys)
    assert code == 2 and needle in err, err


@pytest.mark.parametrize("flags, needle", [
    (["--script=--help"], "--script '--help': must not"),
    (["--hosts=--help,node2"], "--hosts '--help': must not"),
    (["--master-addr=-x"], "--master-addr '-x': must not"),
    (["--save-dir=-x"], "--save-dir '-x': must not"),
    (["--pretrained-checkpoint=-x"], "--pretrained-checkpoint '-x': must not"),
    (["--slurm-partition=-p"], "--slurm-partition '-p': must not"),
    (["--lr", "inf"], "--lr must be a finite number"),
    (["--nccl-env", "=1"], "--nccl-env '=1'"),
])
def test_emit_flags_starting_with_a_dash_or_not_finite(flags, needle, tmp_path, capsys):
    code, _, err = run(["emit", "--recipe", "cpu-demo", "--out", str(tmp_path / "job"), *flags], capsys)
    assert code == 2 and needle in err, err


def test_emit_out_edge_cases(tmp_path, capsys, monkeypatch):
    import os

    monkeypatch.chdir(tmp_path)
    os.symlink(tmp_path / "gone", tmp_path / "link")
    for out, needle in ((".", "not . or .."), ("link", "does not exist"), ("x" * 300, "this file system allows"),
                        (str(tmp_path.parent), "one above it")):
        code, _, err = run(["emit", "--recipe", "cpu-demo", "--out", out, "--force"], capsys)
        assert code == 2 and needle in err, (out, err)
    assert not list(tmp_path.glob(".*"))  # no ..old-XXXX or .tmp- folders left


def test_subcommands_never_import_the_cli_back():
    import ast
    from pathlib import Path

    import autotune.commands

    folder = Path(autotune.commands.__file__).parent
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert "autotune.cli" not in imported, path.name
    cli = Path(autotune.commands.__file__).parent.parent / "cli.py"
    assert len(cli.read_text(encoding="utf-8").splitlines()) < 80  # it only assembles the parser


@pytest.mark.parametrize("fixture, said", [("gemma3-27b", True), ("gemma3-27b-text", False)])
def test_estimate_says_a_multimodal_config_is_counted_without_its_vision_tower(fixture, said, capsys):
    code, out, _ = run(["estimate", "--model", str(Path(__file__).parent / "fixtures" / "hf" / fixture),
                        "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "4096", "--global-batch", "64"], capsys)
    assert code == 0
    assert ("model: the language model (text_config) only: the vision tower" in out) is said
