"""A Megatron-Bridge checkpoint's run_config.yaml (the whole ConfigContainer, tests/fixtures/bridge/SOURCES.md) as
`autotune validate` / `estimate --from` / `plan --from` input, without Bridge installed. Every library recipe's
file, as Bridge 0.6.2 writes it, is read back in tests/emit/test_bridge_run_config.py (slow)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.emit.validate_files import file_kind
from autotune.job_files import read_job

RUN_CONFIG = Path(__file__).parent / "fixtures" / "bridge" / "run_config.yaml"


def test_a_whole_bridge_config_is_told_by_its_name_or_its_first_line(tmp_path):
    assert file_kind(RUN_CONFIG) == "megatron-bridge"
    renamed = tmp_path / "qwen3_job.yaml"  # any name: ConfigContainer.to_yaml's first line says what it is
    shutil.copy(RUN_CONFIG, renamed)
    assert file_kind(renamed) == "megatron-bridge"
    accelerate = tmp_path / "job.yaml"
    accelerate.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 8\n")
    assert file_kind(accelerate) == "accelerate"
    assert file_kind(tmp_path / "run_config.json") == "deepspeed"  # the name alone: a YAML only


def test_the_model_and_plan_are_the_files_own():
    job = read_job([str(RUN_CONFIG)], gpu="h100-sxm-80gb", num_gpus=16)
    assert job.model.name == "qwen3-30b-a3b"  # by the shape the model section states; no --model
    p = job.plan
    assert (p.engine, p.tp, p.pp, p.cp, p.ep, p.expert_tp) == ("megatron", 1, 1, 1, 16, 1)
    assert (p.micro_batch_size, p.global_batch_size, p.seq_len, p.zero_stage) == (1, 1024, 4096, 1)
    # the recipe's TE CUDA graphs of the router and the dispatch preprocessing, as the dump writes the enum members
    assert (p.cuda_graph, p.cuda_graph_scope) == ("transformer_engine", ("moe_router", "moe_preprocess"))
    assert p.tp_overlap in (None, "none")  # the recipe's tp_comm_overlap at tp 1: Bridge turns it off at setup
    assert any("Megatron-Bridge turns it off at setup" in n for n in job.notes)


def test_validate_estimate_and_plan_take_it(capsys):
    # one warning, no error: Bridge's own recipe asks for TP overlap at tp 1, which Bridge turns off (exit 1: any
    # problem, warnings included)
    assert main(["validate", str(RUN_CONFIG), "--world-size", "16"]) == 1
    out = capsys.readouterr().out
    assert "0 error(s), 1 warning(s)" in out and "$.comm_overlap.tp_comm_overlap" in out, out
    assert main(["estimate", "--from", str(RUN_CONFIG), "--gpu", "h100-sxm-80gb", "--num-gpus", "16"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-30b-a3b" in out and "tp1 pp1 dp16 ep16" in out
    assert main(["plan", "--from", str(RUN_CONFIG), "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--top", "3"]) == 0
    assert "current job: megatron tp1 pp1 dp16 ep16" in capsys.readouterr().out


def test_a_dense_models_dump_keeps_no_expert_settings(tmp_path):
    """A dense model's whole config holds TransformerConfig's MoE defaults (dispatcher allgather, expert TP = tp):
    they build nothing without experts and must not make an MoE plan."""
    text = RUN_CONFIG.read_text()
    dense = tmp_path / "run_config.yaml"
    for old, new in (("  num_moe_experts: 128\n", "  num_moe_experts: null\n"),
                     ("  expert_model_parallel_size: 16\n", "  expert_model_parallel_size: 1\n"),
                     ("  cuda_graph_impl: transformer_engine\n", "  cuda_graph_impl: none\n")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    dense.write_text(text)
    job = read_job([str(dense)], gpu="h100-sxm-80gb", num_gpus=16)
    assert job.model.moe is None and (job.plan.ep, job.plan.etp, job.plan.moe_dispatcher) == (1, None, None)


def test_the_containers_target_is_no_unknown_section_but_another_key_is(tmp_path, capsys):
    text = RUN_CONFIG.read_text()
    assert text.startswith("_target_: megatron.bridge.training.config.ConfigContainer\n")
    main(["validate", str(RUN_CONFIG), "--world-size", "16"])
    assert "_target_" not in capsys.readouterr().out
    typo = tmp_path / "run_config.yaml"
    typo.write_text(text.replace("\ntrain:\n", "\ntrian:\n"))
    assert main(["validate", str(typo), "--world-size", "16"]) == 1
    assert "'trian' is not a ConfigContainer section" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, says", [
    ("  num_layers: 48\n", "  num_layers: abc\n", "model.num_layers must be a positive integer, got 'abc'"),
    ("  hidden_size: 2048\n", "  hidden_size: 2048.5\n", "model.hidden_size must be a positive integer, got 2048.5"),
    ("  num_query_groups: 4\n", "  num_query_groups: x\n", "model.num_query_groups must be a positive integer"),
    ("  window_size: null\n", "  window_size: 5\n", "model.window_size must be [left, right] token counts"),
    ("  moe_layer_freq: 1\n", "  moe_layer_freq: [0, 1]\n", "--moe-layer-freq gives 2 entries for 48 layers"),
])
def test_a_bad_model_field_is_exit_2_naming_it(tmp_path, capsys, old, new, says):
    text = RUN_CONFIG.read_text()
    assert text.count(old) == 1, old
    path = tmp_path / "run_config.yaml"
    path.write_text(text.replace(old, new))
    assert main(["estimate", "--from", str(path), "--gpu", "h100-sxm-80gb", "--num-gpus", "16"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_a_model_and_dataset_length_that_differ_are_an_error(tmp_path, capsys):
    """Bridge's validate() asserts they match (training/config.py:1505-1509; tests/emit/test_bridge_run_config.py
    shows Bridge refusing its own Kimi-K2 recipe so)."""
    text = RUN_CONFIG.read_text()
    at = text.index("\nmodel:\n")
    path = tmp_path / "run_config.yaml"
    path.write_text(text[:at] + text[at:].replace("  seq_length: 4096\n", "  seq_length: 131072\n", 1))
    assert main(["validate", str(path), "--world-size", "16"]) == 1
    out = capsys.readouterr().out
    assert "error: $.model.seq_length: model.seq_length 131072 and dataset.seq_length 4096 differ" in out, out


def test_tp_overlap_is_the_comm_overlap_sections_where_there_is_one(tmp_path):
    """A CommOverlapConfig's values replace the model's at setup (Bridge 0.6.2 training/comm_overlap.py:438-439), and
    Bridge turns TP overlap off below tp 2 or without sequence parallelism (:442-451)."""
    def plan_of(text: str):
        path = tmp_path / "bridge_overrides.yaml"
        path.write_text(text)
        return read_job([str(path)], model="llama3-8b", gpu="h100-sxm-80gb", num_gpus=8).plan

    model = "model:\n  tensor_model_parallel_size: 2\n  sequence_parallel: true\n  tp_comm_overlap: true\n"
    assert plan_of(model + "comm_overlap:\n  tp_comm_overlap: false\n").tp_overlap in (None, "none")
    assert plan_of(model).tp_overlap == "userbuffers"  # no CommOverlapConfig: the model's own field
    assert plan_of(model + "comm_overlap:\n  tp_comm_overlap: true\n").tp_overlap == "userbuffers"
    no_sp = model.replace("sequence_parallel: true", "sequence_parallel: false")
    assert plan_of(no_sp + "comm_overlap:\n  tp_comm_overlap: true\n").tp_overlap in (None, "none")
