"""`autotune validate SCRIPT` on a Megatron-DeepSpeed launch script that writes its own DeepSpeed config (a
here-document, or a template filled by sed: tests/fixtures/megatron_deepspeed/SOURCES.md) checks the flags against
that config as it checks a given pair (autotune.emit.megatron_deepspeed_pair.written_pair_problems), each problem at
the script's line that writes the config; a config it cannot read is a warning saying what was not checked, one
whose filled text is not JSON refuses the input (exit 2), as a given JSON that is not JSON does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.emit.shell_args import read_megatron_args_file
from autotune.emit.written_deepspeed_config import config_name, written_deepspeed_config

FIXTURES = Path(__file__).parents[1] / "fixtures" / "megatron_deepspeed"


def _validate(capsys, *paths, world="8") -> tuple[int, list[dict], str]:
    code = main(["validate", *map(str, paths), "--world-size", world, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code in (0, 1) else []), err


def _filled(script: Path, folder: Path) -> Path:
    """The config the fixture script writes, filled, as a JSON file in ``folder`` under the name the script uses."""
    written = written_deepspeed_config(str(script), _name(script))
    assert written is not None and written.data is not None, written
    path = folder / written.name
    path.write_text(json.dumps(written.data, indent=2))
    return path


def _name(script: Path) -> str | None:
    return config_name(read_megatron_args_file(script))


@pytest.mark.parametrize("script, how, line", [
    ("azure/run-1t.sh", "its here-document writes to ds_config.json", 67),
    ("rebase/ds_pretrain_gpt_125M.sh", "its sed commands write to ds_config_gbs256_mbs2_log10_zero1.json", 289),
    ("MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128.sh", "its sed commands write to ds_config_gpt_gpt-1.3B", 312)])
def test_the_config_a_fixture_writes_is_checked_as_a_given_one(script, how, line, tmp_path, capsys):
    path = FIXTURES / script
    code, found, err = _validate(capsys, path)
    assert f"its flags checked with the DeepSpeed config {how}" in err and f"{path.name}:{line})" in err, err
    # the same problems as the filled config given beside the script, here at the script's line that writes it
    given_code, given, _ = _validate(capsys, path, _filled(path, tmp_path))
    assert code == given_code and [(p["path"], p["severity"]) for p in found] == \
        [(p["path"], p["severity"]) for p in given], (found, given)
    assert all(p["file"] == str(path) and p["line"] == line and how in p["message"] for p in found)
    assert [p["message"].split(f"{line}): ", 1)[1] for p in found] == [p["message"] for p in given]


def test_the_fixtures_say_what_their_written_configs_hold(capsys):
    # run-1t.sh's here-document: an aio key DeepSpeed ignores (its ZeRO-Offload without an optimizer block is fine:
    # the script's --cpu-optimizer passes DeepSpeedCPUAdam, which the rule is told: no JSON-alone warning);
    # the 125M script's template: nothing; the MoE one's: the legacy top-level curriculum_learning DeepSpeed refuses
    said = {s: [p["path"] for p in _validate(capsys, FIXTURES / s)[1]] for s in (
        "azure/run-1t.sh", "rebase/ds_pretrain_gpt_125M.sh", "MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128.sh")}
    assert said == {"azure/run-1t.sh": ["$.aio.thread_count"],
                    "rebase/ds_pretrain_gpt_125M.sh": [],
                    "MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128.sh": ["$.curriculum_learning"]}, said


def test_a_template_not_next_to_the_script_is_a_warning_naming_what_was_not_checked(tmp_path, capsys):
    script = tmp_path / "run" / "ds_pretrain_gpt_1.3B_PR-MoE64or128.sh"
    script.parent.mkdir()
    shutil.copy(FIXTURES / "MoE" / script.name, script)
    code, found, err = _validate(capsys, script)
    assert code == 1 and [(p["path"], p["severity"], p["line"]) for p in found] == \
        [("--deepspeed_config", "warning", 312)], found
    assert "ds_config_gpt_Zero2_TEMPLATE.json, which is neither next to the script nor given" in found[0]["message"]
    assert "the flags are not checked against it" in found[0]["message"]
    assert found[0]["fix"] == (f"give ds_config_gpt_Zero2_TEMPLATE.json too (autotune validate {script} "
                               f"PATH/ds_config_gpt_Zero2_TEMPLATE.json), or the filled config (autotune validate "
                               f"{script} CONFIG.json)")
    assert "checked with" not in err
    # given beside it, the filled config is the pair, and the script's own is not read
    code, found, err = _validate(capsys, script, _filled(FIXTURES / "MoE" / script.name, tmp_path))
    assert [p["path"] for p in found] == ["$.curriculum_learning"] and "checked with" not in err, found
    # the template given beside it is filled, as estimate --from SCRIPT TEMPLATE fills it
    code, found, err = _validate(capsys, script, FIXTURES / "MoE" / "ds_config_gpt_Zero2_TEMPLATE.json")
    assert [(p["path"], p["file"], p["line"]) for p in found] == [("$.curriculum_learning", str(script), 312)], found
    assert "its sed commands write to ds_config_gpt_gpt-1.3B" in err


def test_a_sed_template_given_beside_the_script_is_read_as_its_config_not_linted_alone(tmp_path, capsys):
    # the fork's 125M rebase script away from its template: `validate SCRIPT TEMPLATE` fills the template with the
    # script's sed commands (CONFIG_BATCH_SIZE ... are not JSON: linted alone it is refused), as `estimate --from
    # SCRIPT TEMPLATE` reads it
    script = tmp_path / "ds_pretrain_gpt_125M.sh"
    shutil.copy(FIXTURES / "rebase" / script.name, script)
    template = FIXTURES / "rebase" / "ds_config_gpt_TEMPLATE.json"
    assert main(["validate", str(template), "--world-size", "8"]) == 2 and "not valid JSON" in capsys.readouterr().err
    code, found, err = _validate(capsys, script, template)
    assert (code, found) == (0, []), (found, err)
    assert f"{template}: the template {script} fills with sed: read as its DeepSpeed config, not checked alone" in err
    assert (f"its flags checked with the DeepSpeed config its sed commands write to "
            f"ds_config_gbs256_mbs2_log10_zero1.json from {template} ({script}:289)") in err, err
    # the same as with the template next to the script; a placeholder the script leaves is refused the same way
    assert _validate(capsys, FIXTURES / "rebase" / script.name)[:2] == (0, [])
    script.write_text(script.read_text().replace('    | sed "s/ZERO_STAGE/${zero_stage}/" \\\n', ""))
    code, _, err = _validate(capsys, script, template)
    assert code == 2 and "placeholders left: ZERO_STAGE" in err and "Traceback" not in err, err


SCRIPT = """DS=ds.json
GBS={gbs}
cat <<{delim} > $DS
{{"train_batch_size": $GBS, "train_micro_batch_size_per_gpu": {mbs}, "zero_optimization": {{"stage": {stage}}},
 "bf16": {{"enabled": true}}}}
EOT
deepspeed --num_gpus 8 pretrain_gpt.py --num-layers 12 --hidden-size 768 --num-attention-heads 12 \\
  --seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257 --bf16 --use-flash-attn-v2 \\
  --micro-batch-size 2 --global-batch-size 16 \\
  --deepspeed --deepspeed_config $DS --zero-stage 1 --no-pipeline-parallel
"""
CONFIG = """{{"train_batch_size": {gbs}, "train_micro_batch_size_per_gpu": {mbs},
 "zero_optimization": {{"stage": {stage}}}, "bf16": {{"enabled": true}}}}
"""


@pytest.mark.parametrize("sizes, paths", [
    # train_batch_size 32 beside --global-batch-size 16: the fork sets DeepSpeed's batch from the flags each step,
    # and 32 = 2 x 2 x 8 is a whole triple, so a given pair says nothing; nor does the written one
    ({"gbs": 32, "mbs": 2, "stage": 1}, []),
    ({"gbs": 32, "mbs": 4, "stage": 1}, ["$.train_micro_batch_size_per_gpu"]),
    ({"gbs": 16, "mbs": 2, "stage": 3}, ["$.zero_optimization.stage"]),
    ({"gbs": 20, "mbs": 2, "stage": 1}, ["$.train_batch_size"]),  # 20 is no whole multiple of 2 x 8
])
def test_a_written_config_that_disagrees_with_the_flags_is_reported_as_a_given_one(sizes, paths, tmp_path, capsys):
    (tmp_path / "run.sh").write_text(SCRIPT.format(delim="EOT", **sizes))
    (tmp_path / "given").mkdir()
    (tmp_path / "given" / "ds.json").write_text(CONFIG.format(**sizes))
    given_code, given, _ = _validate(capsys, tmp_path / "run.sh", tmp_path / "given" / "ds.json")
    code, found, err = _validate(capsys, tmp_path / "run.sh")
    assert [p["path"] for p in given] == paths and code == given_code == (1 if paths else 0), given
    assert [p["path"] for p in found] == paths, found
    assert all(p["file"] == str(tmp_path / "run.sh") and p["line"] == 3 for p in found)
    assert [p["message"].split("run.sh:3): ", 1)[1] for p in found] == [p["message"] for p in given]
    assert "its here-document writes to ds.json" in err


def test_a_given_config_is_the_pair_not_the_written_one(tmp_path, capsys):
    (tmp_path / "run.sh").write_text(SCRIPT.format(delim="EOT", gbs=16, mbs=4, stage=1))  # disagrees
    (tmp_path / "ds.json").write_text(CONFIG.format(gbs=16, mbs=2, stage=1))  # agrees
    assert _validate(capsys, tmp_path / "run.sh", tmp_path / "ds.json")[:2] == (0, [])


def test_variables_the_script_does_not_set_are_a_warning(tmp_path, capsys):
    (tmp_path / "run.sh").write_text(SCRIPT.format(delim="'EOT'", gbs=16, mbs=4, stage=1))  # quoted: not expanded
    code, found, _ = _validate(capsys, tmp_path / "run.sh")
    assert code == 1 and [(p["path"], p["severity"], p["line"]) for p in found] == \
        [("--deepspeed_config", "warning", 3)], found
    assert "uses $GBS, which the script does not set" in found[0]["message"]
    assert found[0]["fix"].startswith("set them in the script or give the config too (autotune validate")


def test_a_written_config_that_is_not_json_is_refused_as_a_given_one_is(tmp_path, capsys):
    text = (FIXTURES / "rebase" / "ds_pretrain_gpt_125M.sh").read_text().replace(
        '    | sed "s/ZERO_STAGE/${zero_stage}/" \\\n', "")
    (tmp_path / "run.sh").write_text(text)
    shutil.copy(FIXTURES / "rebase" / "ds_config_gpt_TEMPLATE.json", tmp_path)
    code, _, err = _validate(capsys, tmp_path / "run.sh")
    assert code == 2 and "Traceback" not in err, err
    assert "invalid DeepSpeed config" in err and "placeholders left: ZERO_STAGE" in err
    assert "training.py:77-79" in err and f"give the filled config too (autotune validate {tmp_path / 'run.sh'}" in err
    # estimate --from refuses it with the same words, its own way to give the config at the end
    assert main(["estimate", "--from", str(tmp_path / "run.sh"), "--gpu", "h100-sxm-80gb", "--num-gpus", "8"]) == 2
    estimate_err = capsys.readouterr().err
    said = err.split("run.sh: ", 1)[1].split(" or give")[0]
    assert said in estimate_err and "give the filled config with --from" in estimate_err


def _offload_pair(tmp_path, extra: str):
    """A DeepSpeed JSON with ZeRO-Offload and no optimizer block, and a fork script running it with ``extra`` flags."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                              "bf16": {"enabled": True}}))
    script = tmp_path / "run.sh"
    script.write_text("deepspeed pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                      "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 16 "
                      f"--bf16 --deepspeed --deepspeed_config ds.json --zero-stage 2 --no-pipeline-parallel {extra}\n")
    return ds, script


@pytest.mark.parametrize("extra, expected", [
    ("--cpu-optimizer", []),  # DeepSpeedCPUAdam passed in: neither the JSON-alone warning nor a pair problem
    ("", ["refuses any optimizer but DeepSpeedCPUAdam", "add --cpu-optimizer"]),
    ("--cpu-optimizer --cpu_torch_adam", ["refuses any optimizer but DeepSpeedCPUAdam", "drop --cpu_torch_adam"])])
def test_the_scripts_optimizer_is_weighed_against_zero_offload(extra, expected, tmp_path, capsys):
    # a given pair: ZeRO-Offload with no optimizer block in the JSON, the optimizer the fork builds from the flags
    ds, args = _offload_pair(tmp_path, extra)
    code, found, _ = _validate(capsys, args, ds)
    offload = [p for p in found if p["path"] == "$.zero_optimization.offload_optimizer"]
    if not expected:
        assert offload == [] and code == 0, found
    else:
        errors = [p for p in offload if p["severity"] == "error"]  # beside the JSON-alone warning
        assert code == 1 and len(errors) == 1 and errors[0]["file"] == str(ds), found
        assert all(text in errors[0]["message"] + errors[0]["fix"] for text in expected), errors


OFFLOAD_WARNING = "ZeRO-Offload with no optimizer block"


def test_the_no_optimizer_block_warning_knows_the_client_optimizer(tmp_path, capsys):
    # the rule itself is told the optimizer passed to deepspeed.initialize (engine.py:2342-2346 of 0.19.8 checks its
    # type): a JSON alone (unknown) is warned; a script passing DeepSpeedCPUAdam (--cpu-optimizer) is not; one
    # passing torch's AdamW (--cpu-optimizer --cpu_torch_adam) is, beside the pair's error
    from autotune.emit.validate import validate_deepspeed_config

    written = written_deepspeed_config(str(FIXTURES / "azure" / "run-1t.sh"), _name(FIXTURES / "azure" / "run-1t.sh"))
    ds = tmp_path / written.name
    ds.write_text(json.dumps(written.data, indent=2))
    code, alone, _ = _validate(capsys, ds)
    assert code == 1 and [p["severity"] for p in alone if p["message"].startswith(OFFLOAD_WARNING)] == ["warning"]
    said = {c: [p.message for p in validate_deepspeed_config(written.data, world_size=8, client_optimizer=c)]
            for c in (None, "DeepSpeedCPUAdam", "DeepSpeedCPULion", "AdamW")}
    assert {c: any(m.startswith(OFFLOAD_WARNING) for m in ms) for c, ms in said.items()} == {
        None: True, "DeepSpeedCPUAdam": False, "DeepSpeedCPULion": False, "AdamW": True}, said
    assert not any(OFFLOAD_WARNING in p["message"] for p in _validate(capsys, FIXTURES / "azure" / "run-1t.sh")[1])
    script = tmp_path / "run-1t.sh"
    script.write_text((FIXTURES / "azure" / "run-1t.sh").read_text().replace(
        'CPU_OPTIM=" --cpu-optimizer"', 'CPU_OPTIM=" --cpu-optimizer --cpu_torch_adam"'))
    code, found, _ = _validate(capsys, script)
    offload = [(p["severity"], p["message"]) for p in found if p["path"] == "$.zero_optimization.offload_optimizer"]
    assert [s for s, m in offload if OFFLOAD_WARNING in m] == ["warning"], found
    assert [s for s, m in offload if "drop --cpu_torch_adam" in m or "refuses any optimizer" in m] == ["error"], found


@pytest.mark.parametrize("extra, warned", [("--cpu-optimizer", False), ("--cpu-optimizer --cpu_torch_adam", True)])
def test_a_given_json_is_warned_unless_its_script_passes_deepspeed_cpu_adam(extra, warned, tmp_path, capsys):
    ds, script = _offload_pair(tmp_path, extra)
    found = _validate(capsys, script, ds)[1]
    assert any(p["message"].startswith(OFFLOAD_WARNING) and p["file"] == str(ds) for p in found) == warned, found
    # the JSON alone: the optimizer passed in is unknown, so it is warned
    assert any(p["message"].startswith(OFFLOAD_WARNING) for p in _validate(capsys, ds)[1])


NAMED = """{set_it}deepspeed --num_gpus 8 pretrain_gpt.py --num-layers 12 --hidden-size 768 --num-attention-heads 12 \\
  --seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257 --bf16 --use-flash-attn-v2 \\
  --micro-batch-size 2 --global-batch-size 16 \\
  --deepspeed --deepspeed_config {name} --zero-stage 1 --no-pipeline-parallel
"""


@pytest.mark.parametrize("set_it, name, said", [
    ("", "ds_config.json", "--deepspeed_config ds_config.json is neither written by the script"),
    ("config_json=my_ds.json\n", "$config_json", "--deepspeed_config my_ds.json is neither written by the script"),
    ("", "$config_json", "--deepspeed_config $config_json names a variable the script does not set")])
def test_a_config_the_script_names_but_neither_writes_nor_was_given_is_a_warning(set_it, name, said, tmp_path,
                                                                                 capsys):
    # before: "no problems", the config and the flags against it unchecked and unsaid
    script = tmp_path / "run.sh"
    script.write_text(NAMED.format(set_it=set_it, name=name))
    code, found, _ = _validate(capsys, script)
    line = 4 + bool(set_it)
    assert code == 1 and [(p["path"], p["severity"], p["line"]) for p in found] == \
        [("--deepspeed_config", "warning", line)], found
    assert found[0]["message"].startswith(said) and "the DeepSpeed config is not checked" in found[0]["message"]
    file = "CONFIG.json" if said.endswith("not set") else f"PATH/{Path(said.split()[1]).name}"
    assert found[0]["fix"] == f"give the config too (autotune validate {script} {file})", found[0]
    if "$" not in said:  # next to the script: the fix names it; given, it is the pair and the warning goes
        config = tmp_path / said.split()[1]
        config.write_text(CONFIG.format(gbs=32, mbs=2, stage=1))
        assert _validate(capsys, script)[1][0]["fix"] == f"give the config too (autotune validate {script} {config})"
        assert _validate(capsys, script, config)[:2] == (0, [])


@pytest.mark.parametrize("launcher, world", [
    ("deepspeed --num_nodes 2 --num_gpus 8", 16), ("torchrun --nnodes 2 --nproc_per_node 8", 16),
    ("deepspeed --include localhost:0,1,2,3", 4),  # launcher/runner.py:292-352 of 0.19.8: the slots listed run
    ("deepspeed --include worker-0:0,1@worker-1:2,3", 4)])
def test_the_world_size_is_the_launch_lines_without_world_size(launcher, world, tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(NAMED.format(set_it="", name="ds_config.json").replace("deepspeed --num_gpus 8", launcher)
                      .replace("--global-batch-size 16", f"--global-batch-size {2 * world}"))
    code = main(["validate", str(script), "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and f"no --world-size: assuming {world} (as {script} states)" in err, err
    assert [p["path"] for p in json.loads(out)] == ["--deepspeed_config"], out
    # the one reader of launch lines: estimate --from reads the same world
    assert main(["estimate", "--from", str(script), "--gpu", "h100-sxm-80gb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"]["num_gpus"] == world


@pytest.mark.parametrize("launcher", ["deepspeed --hostfile hostfile", "deepspeed --include worker-0@worker-1:0",
                                      "deepspeed --include worker-0:0,1@worker-1:0"])
def test_a_launch_line_that_does_not_state_the_world_size_names_what_would(launcher, tmp_path, capsys):
    # a host without slots runs all of its hostfile's; hosts with different slot counts are no nodes x GPUs
    script = tmp_path / "run.sh"
    script.write_text(NAMED.format(set_it="", name="ds_config.json").replace("deepspeed --num_gpus 8", launcher))
    assert main(["validate", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"give --world-size N: the files do not say it ({script}: no launch line with numeric --nnodes" in err
    assert "--include HOST:SLOTS" in err and "Traceback" not in err
