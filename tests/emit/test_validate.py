"""The DeepSpeed config linter: one config per mistake, each found at its exact JSON path with its
severity (and line, for files); every problem of a config at once; the `autotune validate` command."""

import argparse
import copy
import json
from pathlib import Path

import pytest

from autotune.commands import validate as validate_command
from autotune.api import make_plan
from autotune.emit.deepspeed import deepspeed_config
from autotune.emit.validate import has_errors, validate_deepspeed_config
from autotune.errors import InputError
from autotune.specs.loading import load_cluster, load_model

FIXTURES = Path(__file__).parent / "fixtures"
MODEL = load_model("llama3-8b")
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
# ZeRO-2, micro-batch 2 x accumulation 4 x dp 8 = 64 sequences.
PLAN = make_plan(MODEL, CLUSTER, global_batch_size=64, micro_batch_size=2, zero_stage=2, seq_len=4096)
BASE = deepspeed_config(MODEL, CLUSTER, PLAN)


def found(config, **kw) -> set[tuple[str, str]]:
    kw.setdefault("world_size", 8)
    return {(p.path, p.severity) for p in validate_deepspeed_config(config, **kw)}


def changed(**top) -> dict:
    cfg = copy.deepcopy(BASE)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


def test_the_base_config_is_clean():
    assert validate_deepspeed_config(BASE, world_size=8) == []


# (id, config, validate kwargs, expected {(path, severity)}): exactly these, nothing else.
MISTAKES = [
    # 64 = 2 x 4 x 8; on 16 GPUs dp is 16: 2 x 4 x 16 = 128.
    ("batch-triple-for-world", BASE, dict(world_size=16), {("$.train_batch_size", "error")}),
    ("gradient-clip-typo", changed(gradient_clip=1.0), {}, {("$.gradient_clip", "warning")}),
    # pp 2 on 8 GPUs: dp 4, so 32 = 2 x 4 x 4 keeps the triple right.
    ("zero2-with-pp", changed(train_batch_size=32, pipeline={"activation_checkpoint_interval": 0}), dict(pp=2),
     {("$.zero_optimization.stage", "error")}),
    ("zero2-with-pipeline-block", changed(pipeline={"activation_checkpoint_interval": 0}), {},
     {("$.pipeline", "warning")}),
    # DeepSpeed ignores it below stage 3 (only the stage-3 optimizer reads it, runtime/engine.py:2731): no refusal
    ("offload-param-at-stage-2", changed(zero_optimization={"offload_param": {"device": "cpu"}}), {},
     {("$.zero_optimization.offload_param", "warning")}),
    ("nvme-without-path", changed(zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}}), {},
     {("$.zero_optimization.offload_param.nvme_path", "error")}),
    ("nvme-optimizer-without-path", changed(zero_optimization={"offload_optimizer": {"device": "nvme"}}), {},
     {("$.zero_optimization.offload_optimizer.nvme_path", "error")}),
    ("fp16-and-bf16", changed(fp16={"enabled": True}), {}, {("$.bf16.enabled", "error")}),
    ("removed-curriculum-learning", changed(curriculum_learning={"enabled": True}), {},
     {("$.curriculum_learning", "error")}),
    ("removed-zero-key", changed(zero_optimization={"zeropp_loco_param": {"err_beta": 0.8}}), {},
     {("$.zero_optimization.zeropp_loco_param", "error")}),
    ("max-grad-norm", changed(optimizer={"params": {**BASE["optimizer"]["params"], "max_grad_norm": 1.0}}), {},
     {("$.optimizer.params.max_grad_norm", "error")}),
    ("stage-4", changed(zero_optimization={"stage": 4}), {}, {("$.zero_optimization.stage", "error")}),
    ("float-micro-batch", changed(train_micro_batch_size_per_gpu=2.5), {},
     {("$.train_micro_batch_size_per_gpu", "error")}),
    ("float-bucket", changed(zero_optimization={"reduce_bucket_size": 5.5e8 + 0.5}), {},
     {("$.zero_optimization.reduce_bucket_size", "error")}),
    ("unknown-zero-key", changed(zero_optimization={"overlap_com": True}), {},
     {("$.zero_optimization.overlap_com", "error")}),
    ("unknown-ignored-block-key", changed(activation_checkpointing={"partitioned_activations": True}), {},
     {("$.activation_checkpointing.partitioned_activations", "warning")}),
    ("scheduler-param-typo", changed(scheduler={"params": {**BASE["scheduler"]["params"], "warmup_steps": 5}}), {},
     {("$.scheduler.params.warmup_steps", "error")}),
    ("sgd-under-zero", changed(optimizer={"type": "SGD", "params": {"lr": 0.1}}), {}, {("$.optimizer.type", "error")}),
    ("unknown-optimizer", changed(optimizer={"type": "AdamWW"}), {}, {("$.optimizer.type", "error")}),
    ("deprecated-key", changed(zero_optimization={"cpu_offload": False}), {},
     {("$.zero_optimization.cpu_offload", "warning")}),
    ("offload-with-client-optimizer",
     {k: v for k, v in changed(zero_optimization={"offload_optimizer": {"device": "cpu"}}).items() if k != "optimizer"},
     {}, {("$.zero_optimization.offload_optimizer", "warning")}),
    ("auto-without-hf", changed(train_batch_size="auto"), {}, {("$.train_batch_size", "error")}),
    ("auto-the-trainer-leaves", changed(zero_optimization={"stage": "auto"}), dict(hf=True),
     {("$.zero_optimization.stage", "warning")}),
    ("autotp-size-not-tp", changed(tensor_parallel={"autotp_size": 4}, train_batch_size=32), dict(tp=2),
     {("$.tensor_parallel.autotp_size", "error")}),
    # Only DeepSpeed's own parser knows this one (a pydantic validator of the fp16 block).
    ("deepspeed-only-loss-scale-window",
     changed(fp16={"enabled": True, "loss_scale_window": 0}, bf16={"enabled": False}), {}, {("$.fp16", "error")}),
]


@pytest.mark.parametrize("config, kwargs, expected", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_each_mistake_at_its_path(config, kwargs, expected):
    assert found(config, **kwargs) == expected


def _one(config, **kw):
    (problem,) = validate_deepspeed_config(config, **{"world_size": 8, **kw})
    return problem


def test_messages_name_the_fix():
    triple = _one(BASE, world_size=16)
    assert "train_batch_size 128 (= micro-batch 2 x accumulation 4 x dp 16)" in triple.fix
    assert "gradient_accumulation_steps 2 (keeps train_batch_size 64)" in triple.fix
    assert triple.source == "rules" and "64 != micro-batch 2 x gradient accumulation 4" in triple.message
    assert "gradient_clipping" in _one(changed(gradient_clip=1.0)).fix
    assert "overlap_comm" in _one(changed(zero_optimization={"overlap_com": True})).fix
    assert "data_efficiency" in _one(changed(curriculum_learning={})).message  # DeepSpeed's own reason
    assert "gradient_clipping: 1.0" in _one(changed(optimizer={"params": {"max_grad_norm": 1.0}})).fix
    assert "zero_allow_untested_optimizer" in _one(changed(optimizer={"type": "SGD"})).fix
    assert _one(changed(train_micro_batch_size_per_gpu=2.5)).fix == "write an integer, e.g. 2"
    assert "--hf" in _one(changed(gradient_accumulation_steps="auto")).fix
    ds_only = _one(changed(fp16={"enabled": True, "loss_scale_window": 0}, bf16={"enabled": False}))
    assert ds_only.source == "deepspeed" and "loss_scale_window must be > 0" in ds_only.message


def test_every_problem_at_once_with_lines():
    problems = validate_deepspeed_config(FIXTURES / "megatron_deepspeed_legacy.json", world_size=8)
    assert {(p.path, p.line) for p in problems} == {
        ("$.bf16.enabled", 19), ("$.curriculum_learning", 20), ("$.zero_optimization.mics_shard_size", 7),
        ("$.optimizer.params.max_grad_norm", 26)}
    assert all(p.severity == "error" for p in problems)
    typo = validate_deepspeed_config(FIXTURES / "gradient_clip_typo.json", world_size=8)
    assert [(p.path, p.severity, p.line) for p in typo] == [("$.gradient_clip", "warning", 5)]
    # The same config on 4 GPUs: the triple too (64 = 2 x 4 x 8, not x 4).
    assert {p.path for p in validate_deepspeed_config(FIXTURES / "gradient_clip_typo.json", world_size=4)} == {
        "$.gradient_clip", "$.train_batch_size"}


def test_not_json_is_unusable_input_naming_line_and_column(tmp_path):
    """Malformed JSON, a trailing comma (DeepSpeed's hjson takes it, json.load-based launchers do not), a
    list, too deep: each raises InputError (exit 2), as an unreadable file does."""
    with pytest.raises(InputError, match="line 3 column 39"):
        validate_deepspeed_config(FIXTURES / "malformed.json", world_size=8)
    for text, match in (('{"a":1,}', "line 1 column 8"), ("[1,2,3]", "not a DeepSpeed JSON config"),
                        ('{"a":' * 200 + "1" + "}" * 200, "deep")):
        (tmp_path / "x.json").write_text(text)
        with pytest.raises(InputError, match=match):
            validate_deepspeed_config(tmp_path / "x.json", world_size=8)


def test_duplicate_keys(tmp_path):
    dup = tmp_path / "dup.json"
    dup.write_text('{\n  "train_batch_size": 64,\n  "train_micro_batch_size_per_gpu": 8,\n  "train_batch_size": 128\n}')
    assert [(p.path, p.line) for p in validate_deepspeed_config(dup, world_size=8)] == [("$.train_batch_size", 4)]


def test_values_judged_nan_infinity_lr_betas(tmp_path):
    text = json.dumps(BASE, indent=2)
    text = text.replace('"lr": 0.0003', '"lr": NaN').replace('"gradient_clipping": 1.0', '"gradient_clipping": Infinity')
    (tmp_path / "nan.json").write_text(text)
    lines = text.splitlines()
    problems = validate_deepspeed_config(tmp_path / "nan.json", world_size=8)
    assert {(p.path, p.severity) for p in problems} == {("$.optimizer.params.lr", "error"),
                                                        ("$.gradient_clipping", "error")}
    assert all("NaN" in lines[p.line - 1] or "Infinity" in lines[p.line - 1] for p in problems)
    for params, bad_path in ((dict(lr="fast"), "lr"), (dict(lr=-1), "lr"), (dict(lr=0), "lr"),
                             (dict(betas=["a", "b"]), "betas"), (dict(betas=[0.9, 1.0]), "betas"),
                             (dict(betas=[0.9]), "betas"), (dict(eps=0), "eps"), (dict(weight_decay=-0.1), "weight_decay")):
        cfg = copy.deepcopy(BASE)
        cfg["optimizer"]["params"].update(params)
        assert found(cfg) == {(f"$.optimizer.params.{bad_path}", "error")}, params
    cfg = copy.deepcopy(BASE)
    cfg["scheduler"]["params"]["warmup_num_steps"] = -5
    assert found(cfg) == {("$.scheduler.params.warmup_num_steps", "error")}


def test_hugging_face_configs():
    hf = FIXTURES / "hf_trainer_zero3.json"
    assert validate_deepspeed_config(hf, world_size=16, hf=True) == []
    plain = validate_deepspeed_config(hf, world_size=16)
    assert len(plain) == 17 and not {p for p in plain if p.severity != "error" or "--hf" not in p.fix}
    # The batch autos are filled for the world size, so a concrete micro-batch is checked against it.
    cfg = json.loads(hf.read_text()) | {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}
    assert validate_deepspeed_config(cfg, world_size=16, hf=True) == []  # accumulation: 64 / (2 x 16) = 2
    assert found(cfg, world_size=24, hf=True) == {("$.train_batch_size", "error")}  # 64 is not 2 x g x 24


def test_autotp_config_sets_the_tensor_parallel_size():
    # DeepSpeed 0.19.8 without an mpu counts the whole world in the batch triple: 64 = 2 x 4 x 8 ranks.
    cfg = changed(tensor_parallel={"autotp_size": 2})
    assert validate_deepspeed_config(cfg, world_size=8) == []
    assert found(changed(tensor_parallel={"autotp_size": 2}, train_batch_size=32), world_size=8) == {
        ("$.train_batch_size", "error")}


def test_unusable_input_raises(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        validate_deepspeed_config(tmp_path / "missing.json", world_size=8)
    yaml_file = tmp_path / "ds.yaml"
    yaml_file.write_text("train_batch_size: 8\n")
    with pytest.raises(InputError, match="not a DeepSpeed JSON config"):
        validate_deepspeed_config(yaml_file, world_size=8)
    with pytest.raises(InputError, match="not divisible by tp x pp x cp"):
        validate_deepspeed_config(BASE, world_size=8, tp=3)


# ---- the command --------------------------------------------------------------------------------
def _registered_in_cli() -> bool:
    from autotune import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return "validate" in sub.choices


def main(argv: list[str]) -> int:
    """``autotune validate`` through the real CLI once it registers the command; until then the same
    handler through a parser of its own, with the CLI's InputError -> exit 2 contract."""
    import sys

    from autotune import cli

    if _registered_in_cli():
        return cli.main(argv)
    parser = argparse.ArgumentParser(prog="autotune")
    validate_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except InputError as err:
        print(f"autotune {args.command}: {err.render()}", file=sys.stderr)
        return 2


@pytest.fixture
def clean_file(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(BASE, indent=2))
    return path


def test_command_clean_config_exits_0(clean_file, capsys):
    assert main(["validate", str(clean_file), "--world-size", "8"]) == 0
    assert "no problems for world size 8" in capsys.readouterr().out
    # No --world-size: the batch triple says 64 / (2 x 4) = 8.
    assert main(["validate", str(clean_file)]) == 0
    assert "assuming 8" in capsys.readouterr().err


def test_command_reports_problems_and_exits_1(capsys):
    assert main(["validate", str(FIXTURES / "gradient_clip_typo.json"), "--world-size", "8"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("warning: $.gradient_clip (line 5): unknown key") and "gradient_clipping" in out[0]
    assert main(["validate", str(FIXTURES / "megatron_deepspeed_legacy.json"), "--world-size", "8", "--json"]) == 1
    listed = json.loads(capsys.readouterr().out)
    assert {(p["path"], p["line"], p["severity"]) for p in listed} >= {("$.curriculum_learning", 20, "error")}
    assert main(["validate", str(FIXTURES / "hf_trainer_zero3.json"), "--world-size", "8", "--hf"]) == 0


def test_command_unusable_input_exits_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.json"), "--world-size", "8"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["validate", str(FIXTURES / "malformed.json"), "--world-size", "8"]) == 2
    for text in ('{"a":1,}', "[1,2,3]"):  # both unusable: exit 2, the reason on stderr, no traceback
        (tmp_path / "x.json").write_text(text)
        assert main(["validate", str(tmp_path / "x.json"), "--world-size", "8"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "x.json" in err
    assert main(["validate", str(FIXTURES / "hf_trainer_zero3.json")]) == 2  # no world size to infer
    assert "--world-size" in capsys.readouterr().err


def test_command_memory_check(clean_file, capsys):
    args = ["validate", str(clean_file), "--world-size", "8", "--model", "llama3-8b", "--seq-len", "4096"]
    assert main(args + ["--gpu", "h100-sxm-80gb"]) == 0
    capsys.readouterr()
    # The same ZeRO-2 config, no activation checkpoints, micro-batch 2 x 4096 tokens: too much for 40 GiB.
    assert main(args + ["--gpu", "a100-40gb", "--json"]) == 1
    (problem,) = json.loads(capsys.readouterr().out)
    assert (problem["path"], problem["severity"], problem["source"]) == ("$.zero_optimization", "error", "memory")
    assert "does not fit in GPU memory" in problem["message"]
    assert main(["validate", str(clean_file), "--world-size", "8", "--model", "llama3-8b"]) == 2  # no --gpu


def test_command_megatron_args(clean_file, tmp_path, capsys):
    args_file = tmp_path / "megatron_args.sh"
    args_file.write_text("--tensor-model-parallel-size 3 \\\n  --micro-batch-size 1\n")
    assert main(["validate", str(clean_file), "--world-size", "8", "--megatron-args", str(args_file), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)
    assert any(p["path"] == "--tensor-model-parallel-size" and p["severity"] == "error" for p in problems)
    assert not any(p["path"].startswith("$") for p in problems)  # the DeepSpeed config itself is clean


def test_emitted_configs_have_no_problems_has_errors_helper():
    assert not has_errors(validate_deepspeed_config(changed(gradient_clip=1.0), world_size=8))
    assert has_errors(validate_deepspeed_config(BASE, world_size=16))


def test_schema_stands_alone():
    """Editors and other tools use the schema without autotune: it is valid Draft 2020-12 and rejects on its
    own what DeepSpeed rejects (removed keys, unknown keys in pydantic blocks, bad enums)."""
    import jsonschema

    from autotune.resources import schema

    ds_schema = schema("deepspeed_config")
    jsonschema.Draft202012Validator.check_schema(ds_schema)
    validator = jsonschema.Draft202012Validator(ds_schema)
    assert validator.is_valid(BASE)
    for bad in (changed(curriculum_learning={}), changed(zero_optimization={"foo": 1}),
                changed(zero_optimization={"stage": 4}), changed(fp16={"enabled": "yes"})):
        assert not validator.is_valid(bad)
    assert validator.is_valid(changed(gradient_clip=1.0))  # ignored by DeepSpeed: a warning, not a schema error


def test_a_bfloat16_auto_is_said_to_train_in_fp32():
    """transformers' ds_config_zero3_bf16.json writes "bfloat16": {"enabled": "auto"}: neither the Trainer nor
    accelerate fills the alias, and DeepSpeed drops "auto", so the job trains in fp32 (the warning said "DeepSpeed uses
    its default or raises")."""
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "bfloat16": {"enabled": "auto"}, "zero_optimization": {"stage": 3}}
    (problem,) = validate_deepspeed_config(config, world_size=8, hf=True)
    assert (problem.path, problem.severity) == ("$.bfloat16.enabled", "warning")
    assert "bf16 stays off and the job trains in fp32" in problem.message and '"bf16"' in problem.fix
