"""The CLI contract: --json fields, tables, exit codes, every problem named, no tracebacks."""

import json
import subprocess
import sys

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
    assert tps == sorted(tps, reverse=True)
    assert doc["num_enumerated"] == doc["num_feasible"] + sum(doc["rejections"].values())


def test_every_problem_at_once_and_exit_2(capsys):
    code, out, err = run(["estimate", "--model", "llama3-70", "--gpu", "h100", "--num-gpus", "0",
                          "--micro-batch", "0"], capsys)
    assert code == 2 and out == ""
    for needle in ("--num-gpus must be >= 1 and <= 1,048,576", "--micro-batch", "did you mean llama3-70b",
                   "did you mean h100-pcie-80gb, h100-sxm-80gb"):
        assert needle in err
    assert "Traceback" not in err


def test_impossible_request_says_what_would_work(capsys):
    code, out, err = run(["plan", "--model", "llama3-405b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8",
                          "--seq-len", "8192"], capsys)
    assert code == 2 and out == ""
    assert "no plan of the" in err and "needs at least" in err and "without offload" in err


def test_min_gpus_and_max_model(capsys):
    code, out, _ = run(["plan", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8",
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
