"""`autotune validate` over the files `autotune emit` writes: each kind is recognised and judged by its own
engine's table (Megatron-DeepSpeed arguments against Megatron-DeepSpeed's flags, not Megatron-LM's); unknown
flags come with the nearest known flag and their line."""

import json

import pytest

from autotune.cli import main
from autotune.emit.validate_files import file_kind, validate_file

EMIT = ["emit", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "4096",
        "--global-batch", "16"]


@pytest.fixture(scope="module")
def mds_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("jobs") / "mds"
    assert main(EMIT + ["--engine", "megatron-deepspeed", "--tp", "2", "--pp", "2", "--zero", "1",
                        "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def megatron_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("jobs") / "megatron"
    assert main(EMIT + ["--engine", "megatron", "--tp", "2", "--pp", "2", "--zero", "1", "--out", str(out)]) == 0
    return out


def _configs(job):
    return sorted(str(p) for p in job.iterdir() if p.suffix in (".json", ".yaml", ".toml") or p.name.endswith("args.sh"))


@pytest.mark.parametrize("job", ["mds_job", "megatron_job"])
def test_validate_accepts_every_file_emit_writes(job, request, capsys):
    files = _configs(request.getfixturevalue(job))
    assert files
    assert main(["validate", *files]) == 0, capsys.readouterr().out
    assert "no problems for world size 8" in capsys.readouterr().out


def test_megatron_deepspeed_args_are_checked_against_megatron_deepspeeds_table(mds_job):
    args = mds_job / "megatron_deepspeed_args.sh"
    assert file_kind(args) == "megatron-deepspeed"
    assert validate_file(args, world_size=8) == []
    # The same file read as Megatron-LM arguments: --deepspeed and friends do not exist there.
    as_megatron = {p.path for p in validate_file(args, world_size=8, kind="megatron") if p.severity == "error"}
    assert {"--deepspeed", "--deepspeed_config", "--zero-stage"} <= as_megatron


def test_unknown_flag_names_the_nearest_flag_and_its_line(mds_job, tmp_path):
    text = (mds_job / "megatron_deepspeed_args.sh").read_text().splitlines()
    # Megatron-LM's name for GQA and a typo, each on a line of its own inside the array.
    at = text.index("MEGATRON_DEEPSPEED_ARGS=(") + 1
    text[at:at] = ["  --num-query-groups 8", "  --micro-batchsize 1"]
    bad = tmp_path / "megatron_deepspeed_args.sh"
    bad.write_text("\n".join(text) + "\n")
    problems = {p.path: p for p in validate_file(bad, world_size=8)}
    assert problems["--num-query-groups"].line == at + 1
    assert "Megatron-DeepSpeed" in problems["--num-query-groups"].message
    assert problems["--micro-batchsize"].line == at + 2
    assert "--micro-batch-size" in problems["--micro-batchsize"].fix


def test_megatron_deepspeed_rules(tmp_path):
    path = tmp_path / "args.sh"
    path.write_text("--deepspeed --zero-stage 2 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\\n"
                    "  --micro-batch-size 1 --global-batch-size 6 --fp16 --bf16\n")
    found = {(p.path, p.line) for p in validate_file(path, world_size=8) if p.severity == "error"}
    # 8 = 2 x 2 x dp 2: 6 % (1 x 2) = 0 passes; ZeRO-2 under the pipeline engine, no --deepspeed_config, fp16+bf16.
    assert found == {("--zero-stage", 1), ("--deepspeed", 1), ("--fp16", 2)}


def test_megatron_deepspeed_experts_whole_on_each_tp_rank(tmp_path):
    """DeepSpeed-MoE in the fork splits experts over tp only with --enable-expert-tensor-parallelism."""
    path = tmp_path / "args.sh"
    base = ("--deepspeed --deepspeed_config ds.json --tensor-model-parallel-size 2 --num-experts 8 "
            "--micro-batch-size 1 --global-batch-size 8")
    path.write_text(base + "\n")
    found = [p for p in validate_file(path, world_size=8) if p.path == "--num-experts"]
    assert [p.severity for p in found] == ["warning"] and "--enable-expert-tensor-parallelism" in found[0].fix
    path.write_text(base + " --enable-expert-tensor-parallelism\n")
    assert not [p for p in validate_file(path, world_size=8) if p.path == "--num-experts"]


def test_plan_json_is_a_kind_of_its_own(mds_job, capsys):
    plan = mds_job / "plan.json"
    assert file_kind(plan) == "plan"
    assert main(["validate", str(plan), "--world-size", "16", "--json"]) == 1
    (problem,) = json.loads(capsys.readouterr().out)
    assert problem["path"] == "$.plan" and "8 ranks" in problem["message"]


def test_megatron_values_are_judged(tmp_path):
    path = tmp_path / "megatron_args.sh"
    path.write_text("MEGATRON_ARGS=(\n  --num-layers -1\n  --lr nan\n  --adam-beta2 1.5\n  --micro-batch-size 1\n)\n")
    found = {(p.path, p.line) for p in validate_file(path, world_size=8) if p.severity == "error"}
    assert found == {("--num-layers", 2), ("--lr", 3), ("--adam-beta2", 4)}


def test_a_huge_megatron_args_file_is_refused_at_once(tmp_path, capsys):
    import time

    path = tmp_path / "megatron_args.sh"
    path.write_text("--num-layers " + "9" * (8 << 20) + "\n")  # one 8 MB line
    start = time.monotonic()
    assert main(["validate", str(path), "--world-size", "8"]) == 2
    assert time.monotonic() - start < 5  # read up to the 1 MiB limit, not tokenized
    assert "larger than 1 MiB" in capsys.readouterr().err
    # Under the size limit, a 200 KB line is refused by length, not shlex-split for seconds.
    path.write_text("--num-layers " + "9" * 200_000 + "\n")
    assert main(["validate", str(path), "--world-size", "8"]) == 2
    assert "line 1 is longer than" in capsys.readouterr().err
