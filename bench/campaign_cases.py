"""The cases of bench/hostile_campaign.py and how each ending is classified (issue 21's kinds).

A case is an argument list for ``autotune.cli.main`` plus the files it names (written into the case's own folder,
``@CASE@`` in an argument), optionally commands run first (``pre``) and an expectation:

- ``any``: fuzz (random arguments built from each subcommand's own argparse parser, files of random contents):
  it must end 0/1/2 in time with no traceback;
- ``refuse``: an input issue 21 lists as "nonsense accepted" (with variants): exit 0, or a tune that reaches its
  study, is nonsense accepted;
- ``pass``: ``validate`` on a correct real-world file (tests/fixtures/realworld/good and the files issue 21
  names): a non-zero exit, an error, or a warning the engine itself would not print, is a false alarm;
- ``dataloss``: ``emit --force`` over a folder holding a user's file, killed inside the swap (in a process of
  its own), then emitted again: the user's file must still be somewhere.

The list is a function of (n, seed, fixtures, parser spec) only, so two checkouts get the identical cases.
"""

from __future__ import annotations

import json
import random
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

CASE = "@CASE@"  # the case's own folder, in arguments and pre-commands
KINDS = ("traceback", "hang", "data loss", "nonsense accepted", "false alarm", "bad exit code", "clean",
         "not measured")
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Case:
    id: int
    family: str  # "fuzz:estimate", "refuse:fp8-on-cpu", "realworld:accelerate_fsdp.yaml", "special:...", ...
    argv: list[str]
    files: dict[str, object] = field(default_factory=dict)  # relative path -> str/bytes, or ["fifo"] / ["dir"]
    pre: list[list[str]] = field(default_factory=list)  # run first, in the same folder (their ending is ignored)
    expect: str = "any"  # any | refuse | pass | dataloss
    warnings: list[str] = field(default_factory=list)  # pass: the warnings' paths the engine itself prints

    def to_json(self) -> dict:
        d = asdict(self)
        d["files"] = {k: (v.decode("latin-1") if isinstance(v, bytes) else v) for k, v in self.files.items()}
        d["binary"] = sorted(k for k, v in self.files.items() if isinstance(v, bytes))
        return d

    def shell(self, folder: str = "$D") -> str:
        """The case as a command line (the case's files lie in ``folder``)."""
        return "autotune " + shlex.join(a.replace(CASE, folder) for a in self.argv)


def write_files(case: Case, folder: Path) -> None:
    import os

    folder.mkdir(parents=True, exist_ok=True)
    for rel, content in case.files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == ["fifo"]:
            os.mkfifo(path)
        elif content == ["dir"]:
            path.mkdir(exist_ok=True)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_bytes(str(content).encode("utf-8", "surrogatepass"))


# ---- the parser's flags, as data (so the generator does not import the checkout under test) ----------------------

def parser_spec(build_parser) -> dict:
    """{command: [{"flags": [...], "nargs": ..., "choices": [...], "type": name, "dest": ...}]} of the CLI."""
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    spec = {}
    for name, p in sub.choices.items():
        spec[name] = [{"flags": list(a.option_strings), "nargs": a.nargs if not isinstance(a.nargs, int) else a.nargs,
                       "choices": [str(c) for c in a.choices] if a.choices else None,
                       "type": getattr(a.type, "__name__", None) if a.type is not None else None, "dest": a.dest}
                      for a in p._actions if a.dest != "help"]
    return spec


# ---- file contents (tests/test_fuzz_cli.py's kinds, as a seeded generator) -----------------------------------------
TINY_MODEL = {"name": "t", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128,
              "vocab_size": 256}
HF = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
      "num_hidden_layers": 2, "vocab_size": 256}
CLUSTER = "gpu: h100-sxm-80gb\nnum_nodes: 1\ngpus_per_node: 8\n"
CALIBRATION = {"gemm_peak_fraction": 0.7, "gemm_half_dim": 50.0}
DS_CONFIG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
             "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}
HOSTILE_VALUES = [None, True, -1, 0, 10**30, 1e308, "abc", "-x", "", [], {}, ["llama"], "no", 0.5, "--help",
                  "a" * 1000, "\u202e", "$(touch /tmp/pwned)"]
HUGE_AND_DEEP = [
    "x = 1" + "0" * 4300 + "\n", "x = " + "[" * 5000 + "]" * 5000 + "\n",
    "[job]\ndump_folder = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
    '{"train_batch_size": 1e400, "train_micro_batch_size_per_gpu": 1}', '{"train_batch_size": ' + "9" * 5000 + "}",
    '{"gemm_peak_fraction": 4.9e-324}', '{"gemm_peak_fraction": 999999}', '{"overlap_cost": -0.0}',
    "n1 slots=99999999999999999999\n", "n1 slots=8\nn1 slots=8\n", "n1 slots=0\n", "slots=8\n",
    "[parallelism]\ntensor_parallel_degree = " + "9" * 5000 + "\n", "[training]\nsteps = -" + "9" * 400 + "\n",
]
ODD_TEXTS = ["", "null", "[1, 2]", '{"candidates": 5}', '{"candidates": [null]}', "{" * 5000, "[" * 100_000,
             '{"a": NaN}', "\ufeff{}", "key: value", "- a\n- b", "'unterminated", '{"model": {}, "cluster": {}, "plan": {}}',
             "#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers\n", "A=(\ntorchrun x.py ${A[@]}\n", "\x00\x01\x02"]
CLUSTER_TAILS = ["", "num_nodes: 100000000000\n", "intra_node_bandwidth_gb_per_s: .inf\n", "? [a, b]\n: 1\n",
                 "x: &a [1]\ny: *a\n", "gpu: 5\n"]
NUMBERS = ["0", "-1", "1", "2", "3", "8", "64", "nan", "inf", "-inf", "1e308", "1" + "0" * 30, "abc", "", "1.5",
           "4096", "1048576", "1048577", "0x10", "1" * 5000]
GOOD_INTS, GOOD_FLOATS = ["1", "2", "4", "8", "16"], ["0", "0.05", "0.5", "1", "3e-4"]
LISTS = {"zero": ["0", "1", "2", "3", "0,1,2,3", "1,3", "4"], "precision": ["bf16", "fp16", "fp8", "bf16,fp8", "fp4"],
         "recompute": ["none", "selective", "full", "none,full", "some"],
         "engine": ["deepspeed", "megatron", "fsdp", "hf", "megatron-deepspeed", "deepspeed,fsdp", "jax"]}
FILE_DESTS = {"model", "cluster", "calibration", "plan_json", "recipe", "megatron_args", "files", "from_files",
              "hostfile", "script"}
# Outputs: only folders inside the case's folder or places nothing can be written (never /dev/null: an old
# `emit --out /dev/null --force` could move it aside).
OUTPUT_DESTS = {"out", "save_dir", "storage", "nvme_path"}
OUT_VALUES = ["job", "out/x", ".", f"{CASE}/o", "x" * 300, "/proc/autotune-x", "/dev/zero/x",
              "/".join(["deep"] * 60) + "/x", "f0.json/through-a-file"]
NAMED = ["tiny-gpt", "tiny-llama", "llama3-8b", "h100-sxm-80gb", "cpu", "cpu-demo", "-x", "--help", "a,b",
         "bf16,fp8", "1,3", "x=y", "NCCL_A=1", "/dev/null", "/dev/zero", "/nonexistent/x.yaml", "x" * 300,
         "/proc/autotune-x", "/dev/zero/x", "/".join(["deep"] * 60) + "/x.json", "f0.json/through-a-file.json"]
TEXT_POOL = "abcxyz019-_=,.:/ \t\n'\"$`\\{}[]*?~é中\u202e\u200b\U0001f600"
# tune: flags that could start trials on this machine; left out as tests/test_fuzz_cli.py leaves them out.
TUNE_SKIP = {"--storage", "--resume", "--worker", "--workload", "--script", "--command", "--gpu", "--num-gpus",
             "--cluster", "--out", "--calibration", "--study-name", "--launcher", "--hostfile", "--include",
             "--exclude"}


def _json_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 3 and r < 0.25:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 3 and r < 0.45:
        return {_text(rng, 8): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return rng.choice([None, True, False, rng.randint(-(10**20), 10**20), rng.uniform(-1e6, 1e6), rng.random(),
                       _text(rng, 12), 0, 1, -1])


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(TEXT_POOL) for _ in range(rng.randint(0, size)))


def _mutated(rng: random.Random, base: dict) -> str:
    doc = dict(base)
    for _ in range(rng.randint(0, 3)):
        key = rng.choice(sorted(doc) + ["extra", "moe", "launch", "emit", "candidates", "spec"])
        doc[key] = rng.choice(HOSTILE_VALUES) if rng.random() < 0.5 else _json_value(rng)
    return json.dumps(doc)


def _mutated_text(rng: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True) or [""]
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        op = rng.randrange(5)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[i])
        elif op == 2:
            lines[i] = "".join(rng.choice(NUMBERS) if ch.isdigit() and rng.random() < 0.3 else ch for ch in lines[i])
        elif op == 3:
            lines = lines[:i] + [lines[i][: rng.randint(0, len(lines[i]))]]
        else:
            lines[i] = lines[i].replace(" ", rng.choice(["", "  ", "=", '"']), 1)
        lines = lines or [""]
    return "".join(lines)


def file_contents(rng: random.Random, realworld: list[str]) -> object:
    pick = rng.randrange(11)
    if pick == 0:
        return _mutated(rng, TINY_MODEL)
    if pick == 1:
        return _mutated(rng, HF)
    if pick == 2:
        return _mutated(rng, CALIBRATION)
    if pick == 3:
        return _mutated(rng, DS_CONFIG)
    if pick == 4:
        return rng.choice([json.dumps(DS_CONFIG), json.dumps(TINY_MODEL), json.dumps(HF), CLUSTER])
    if pick == 5:
        return CLUSTER + rng.choice(CLUSTER_TAILS)
    if pick == 6:
        return rng.choice(ODD_TEXTS)
    if pick == 7:
        return json.dumps(_json_value(rng))
    if pick == 8:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if pick == 9 and realworld:
        return _mutated_text(rng, rng.choice(realworld))
    return rng.choice(HUGE_AND_DEEP)


def _value(rng: random.Random, opt: dict, files: list[str]) -> str:
    """Mostly plausible values (so that cases get past argparse), often hostile ones."""
    dest = opt["dest"]
    if dest in OUTPUT_DESTS:
        return rng.choice(OUT_VALUES)
    if opt["choices"]:
        return rng.choice(opt["choices"] * 3 + ["bogus", ""])
    if dest in LISTS and rng.random() < 0.7:
        return rng.choice(LISTS[dest])
    if opt["type"] not in (None, "str") and rng.random() < 0.6:
        return rng.choice(GOOD_FLOATS if opt["type"] == "float" else GOOD_INTS)
    if dest in FILE_DESTS and rng.random() < 0.5:
        return rng.choice(files)
    kind = rng.randrange(4)
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return rng.choice(files)
    if kind == 2:
        return _text(rng, 10)
    return rng.choice(NAMED)


def _torch_bytes(obj) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _checkpoint_state(rng: random.Random) -> bytes:
    """A torch pickle as a checkpoint holds one: Megatron arguments, DeepSpeed model states or Trainer-like
    attributes, with hostile values often."""
    import argparse

    odd = [0, -1, 2**70, "8", None, [1, 2], 1.5, True]
    args = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=128, micro_batch_size=1,
                global_batch_size=8, tensor_model_parallel_size=2, world_size=8, bf16=True, num_experts=None)
    for key in rng.sample(sorted(args), rng.randint(0, 3)):
        args[key] = rng.choice(odd)
    ds = dict(DS_CONFIG)
    pick = rng.randrange(4)
    if pick == 0:
        return _torch_bytes({"args": argparse.Namespace(**args), "iteration": 1})
    if pick == 1:
        return _torch_bytes({"ds_config": ds if rng.random() < 0.7 else rng.choice(odd), "dp_world_size":
                             rng.choice([8, 4] + odd), "mp_world_size": rng.choice([1] + odd)})
    if pick == 2:
        return _torch_bytes({"ds_config": ds, "dp_world_size": 4, "mp_world_size": 2,
                             "args": argparse.Namespace(**args, deepspeed=True, zero_stage=rng.choice([1, 3] + odd))})
    return _torch_bytes(rng.choice([[1, 2], {"args": "x"}, None, argparse.Namespace(**args)]))


def checkpoint_files(rng: random.Random) -> dict[str, object]:
    """A checkpoint folder ``ck/`` in one of the layouts --from reads (Megatron-LM's tracker and iter_ folders,
    DeepSpeed's latest and tag folder, a Trainer's training_args.bin), its files often damaged."""
    content = (lambda: _checkpoint_state(rng) if rng.random() < 0.6 else
               bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))))
    layout = rng.randrange(4)
    if layout == 0:
        tracker = rng.choice(["1", "release", "", "-1", "9" * 50, "1\n2", "../x"])
        return {"ck/latest_checkpointed_iteration.txt": tracker,
                rng.choice(["ck/iter_0000001/common.pt", "ck/iter_0000001/mp_rank_00/model_optim_rng.pt",
                            "ck/release/common.pt", "ck/iter_0000001/metadata.json"]): content()}
    if layout == 1:
        return {rng.choice(["ck/iter_0000007/common.pt", "ck/iter_0000007/mp_rank_00_000/model_optim_rng.pt"]):
                content()}
    if layout == 2:
        tag = rng.choice(["global_step1", "", "../ck", "nope"])
        return {"ck/latest": tag, rng.choice(["ck/global_step1/mp_rank_00_model_states.pt",
                                              "ck/global_step1/zero_pp_rank_0_mp_rank_00_model_states.pt"]): content(),
                **({"ck/config.json": json.dumps(HF)} if rng.random() < 0.5 else {})}
    return {"ck/training_args.bin": content(), **({"ck/config.json": json.dumps(HF)} if rng.random() < 0.5 else {})}


def fuzz_case(rng: random.Random, command: str, spec: dict, realworld: list[str]) -> Case:
    files: dict[str, object] = {}
    for i in range(rng.randint(1, 3)):
        name = f"f{i}{rng.choice(['.json', '.yaml', '.yml', '', '.sh', '.toml', '.hostfile'])}"
        files[name] = file_contents(rng, realworld)
    paths = [f"{CASE}/{name}" for name in files]
    if rng.random() < 0.15:  # a checkpoint folder (--from reads them)
        files |= checkpoint_files(random.Random(rng.random()))
        paths.append(f"{CASE}/ck")
    actions = spec[command]
    options = [a for a in actions if a["flags"]]
    if command == "tune":
        options = [a for a in options if not set(a["flags"]) & TUNE_SKIP]
    argv = [command]
    for a in actions:
        if a["flags"] or a["dest"] == "script_args":
            continue
        if command == "recipes" and a["dest"] == "names":
            argv += [rng.choice(paths + ["cpu-demo", "nope", "-x"]) for _ in range(rng.randint(0, 2))]
        elif command == "recipes" and a["dest"] == "action":
            argv += rng.choice([[], ["list"], ["show"], ["bogus"]])  # never regenerate: it writes recipes/
        else:
            argv += [rng.choice(paths) for _ in range(1 if a["nargs"] != "+" else rng.randint(1, 2))]
    base = {"estimate": ["--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8"],
            "plan": ["--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--no-offload"],
            "emit": ["--out", f"{CASE}/job"] + rng.choice([[], ["--recipe", "cpu-demo"],
                                                             ["--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2"]]),
            "tune": ["--model", "tiny-gpt", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--out", f"{CASE}/t"],
            }.get(command, [])
    if rng.random() < 0.5 or command in ("tune", "emit"):
        argv += base
    for _ in range(rng.randint(0, 6)):
        if not options:
            break
        a = rng.choice(options)
        flag = rng.choice(a["flags"])
        if command == "plan" and flag in ("--min-gpus", "--max-model"):
            continue  # dozens of plan searches each: a bench of its own, as in tests/test_fuzz_cli.py
        if a["nargs"] == 0:
            argv.append(flag)
        else:
            argv += [flag, _value(rng, a, paths)]
    if f"{CASE}/ck" in paths and command in ("estimate", "plan", "emit") and rng.random() < 0.6:
        argv += ["--from", f"{CASE}/ck"]  # the checkpoint folder as the job (rarely drawn among the options)
    elif f"{CASE}/ck" in paths and command == "validate" and rng.random() < 0.6:
        argv[1:1] = [f"{CASE}/ck"]  # the folder alone first: validate checks the config it saved
    return Case(0, f"fuzz:{command}", argv, files)


FUZZ_SHARE = {"estimate": 600, "plan": 150, "emit": 120, "validate": 250, "recipes": 150, "tune": 250}


def build_cases(n: int, seed: int, spec: dict, fixtures: Path, cpu_demo_recipe: str, *, processes: bool = True) -> list[Case]:
    """The campaign: every fixed case (issue 21's lists) when n allows, the rest fuzz, split as tests/test_fuzz_cli.py
    splits its examples. With a small n, a seeded sample of the fixed cases is half of it."""
    from campaign_targeted import dataloss_cases, hostile_file_cases, realworld_cases, refuse_cases, special_cases

    rng = random.Random(seed)
    good = {p.name: p.read_text() for p in sorted((fixtures / "good").iterdir())} if (fixtures / "good").is_dir() else {}
    bad = [p.read_text() for p in sorted((fixtures / "bad").iterdir())] if (fixtures / "bad").is_dir() else []
    fixed = refuse_cases(cpu_demo_recipe) + realworld_cases(good) + special_cases() + hostile_file_cases(good)
    if processes:
        fixed += dataloss_cases(seed)
    if len(fixed) > n // 2:
        fixed = rng.sample(fixed, n // 2)
    fuzz_n = max(0, n - len(fixed))
    total = sum(FUZZ_SHARE.values())
    counts = {c: fuzz_n * s // total for c, s in FUZZ_SHARE.items()}
    counts["estimate"] += fuzz_n - sum(counts.values())
    corpus = list(good.values()) + bad
    cases = list(fixed)
    for command, k in counts.items():
        cases += [fuzz_case(rng, command, spec, corpus) for _ in range(k)]
    for i, case in enumerate(cases):
        case.id = i
    return cases


# ---- classification ---------------------------------------------------------------------------------------------

def _problems_json(out: str):
    try:
        doc = json.loads(out)
    except ValueError:
        return None
    if isinstance(doc, dict):
        doc = doc.get("problems", doc.get("files"))
    return doc if isinstance(doc, list) else None


def classify(case: Case, result: dict) -> tuple[str, str]:
    """(kind, one line saying why) for a case's result: {"status", "code", "out", "err", "error", "lost"}."""
    status, code = result.get("status"), result.get("code")
    if status == "setup":  # a step before the case failed: nothing measured
        return "not measured", _last_line(result.get("error", ""))
    text = (result.get("out") or "") + (result.get("err") or "")
    if status == "exception":
        return "traceback", _last_line(result.get("error", ""))
    if TRACEBACK in text:
        return "traceback", _last_line(text[text.rindex(TRACEBACK):])
    if status in ("hang", "died", "memory"):
        return "hang", result.get("error", status)[:300]
    if case.expect == "dataloss":
        if result.get("lost"):
            return "data loss", result.get("lost")
        return "clean", "the user's file is still there"
    if case.expect == "refuse" and (status == "study" or code in (0, None)):
        return "nonsense accepted", "the study started" if status == "study" else "exit 0"
    if case.expect == "pass":
        problems = _problems_json(result.get("out") or "") if "--json" in case.argv else None
        for p in problems or []:
            if isinstance(p, dict) and (p.get("severity") == "error" or p.get("path") not in case.warnings):
                return "false alarm", f"{p.get('severity')} at {p.get('path')}: {str(p.get('message'))[:200]}"
        if code not in (0, None) and not (code == 1 and case.warnings):
            return "false alarm", f"exit {code}: {_last_line(result.get('err') or '') or _last_line(text)}"
    if status != "study" and code not in (0, 1, 2, None):
        return "bad exit code", f"exit {code!r}: {_last_line(text)}"
    return "clean", "the study would start" if status == "study" else f"exit {code}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
