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
FILE_DESTS = {"model", "cluster", "calibration", "plan_json", "recipe", "megatron_args", "files", "hostfile",
              "script"}
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


def fuzz_case(rng: random.Random, command: str, spec: dict, realworld: list[str]) -> Case:
    files: dict[str, object] = {}
    for i in range(rng.randint(1, 3)):
        name = f"f{i}{rng.choice(['.json', '.yaml', '.yml', '', '.sh', '.toml', '.hostfile'])}"
        files[name] = file_contents(rng, realworld)
    paths = [f"{CASE}/{name}" for name in files]
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
    return Case(0, f"fuzz:{command}", argv, files)


# ---- "nonsense accepted": issue 21's list, with variants ---------------------------------------------------------
H100 = ["--gpu", "h100-sxm-80gb"]
TUNE_CPU = ["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64"]
UNFIT = [  # emit of a plan the memory ledger says does not fit (checked: `estimate` says fits: NO for each)
    ["--model", "llama3-70b", *H100, "--num-gpus", "8", "--tp", "8", "--zero", "1", "--seq-len", "8192",
     "--global-batch", "64", "--recompute", "selective"],
    ["--model", "llama3-70b", *H100, "--num-gpus", "8", "--tp", "8", "--zero", "0", "--seq-len", "4096",
     "--global-batch", "8", "--recompute", "none"],
    ["--model", "llama3-405b", *H100, "--num-gpus", "8", "--tp", "8", "--zero", "1", "--seq-len", "4096",
     "--global-batch", "8"],
    ["--model", "llama3-8b", *H100, "--num-gpus", "1", "--zero", "0", "--seq-len", "8192", "--global-batch", "8",
     "--recompute", "none"],
    ["--model", "llama3-8b", "--gpu", "a100-40gb", "--num-gpus", "2", "--zero", "0", "--seq-len", "4096",
     "--global-batch", "8", "--micro-batch", "4", "--recompute", "none"],
    ["--model", "mixtral-8x7b", *H100, "--num-gpus", "8", "--tp", "8", "--zero", "0", "--seq-len", "4096",
     "--global-batch", "8"],
]


def refuse_cases(cpu_demo_recipe: str) -> list[Case]:
    import yaml

    out = []

    def add(topic, argv, files=None, pre=None):
        out.append(Case(0, f"refuse:{topic}", argv, dict(files or {}), list(pre or []), "refuse"))

    learned = [("tiny-gpt", 512), ("gpt3-175b", 2048), ("opt-175b", 2050), ("megatron-gpt-1.7b", 2048)]
    for model, rows in learned:
        for seq in (rows + 1, 2 * rows, 4 * rows) if model == "tiny-gpt" else (rows * 2, rows * 4):
            gpus = ["--num-gpus", "8"] if model == "tiny-gpt" else ["--num-gpus", "1024"]
            add("seq-len-past-learned-positions", ["estimate", "--model", model, *H100, *gpus, "--seq-len", str(seq)])
            if model == "tiny-gpt":
                add("seq-len-past-learned-positions", ["plan", "--model", model, *H100, *gpus, "--seq-len", str(seq)])
                add("seq-len-past-learned-positions", ["emit", "--model", model, *H100, *gpus, "--seq-len", str(seq),
                                                       "--out", f"{CASE}/job"])
    for rows in (128, 1024):
        spec = {"name": "gpt2-like", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
                "ffn_hidden_size": 512, "vocab_size": 1000, "position_embedding": "learned",
                "max_position_embeddings": rows}
        add("seq-len-past-learned-positions", ["estimate", "--model", f"{CASE}/gpt2-like.yaml", *H100, "--num-gpus",
                                               "1", "--seq-len", str(rows + 1)], {"gpt2-like.yaml": yaml.safe_dump(spec)})
    for model in ("tiny-gpt", "tiny-llama"):
        for n in ("1", "2", "4"):
            base = ["--model", model, "--gpu", "cpu", "--num-gpus", n, "--seq-len", "64", "--precision", "fp8"]
            add("fp8-on-cpu", ["estimate", *base])
            add("fp8-on-cpu", ["emit", *base, "--out", f"{CASE}/job"])
        add("fp8-on-cpu", ["plan", "--model", model, "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64",
                           "--precision", "fp8"])
    est = ["estimate", "--model", "llama3-8b", *H100, "--num-gpus", "8", "--tp", "2", "--zero", "1", "--micro-batch",
           "1", "--global-batch", "64", "--seq-len", "4096"]
    for key, value in [("gemm_peak_fraction", "999999"), ("gemm_peak_fraction", "4.9e-324"),
                       ("gemm_peak_fraction", "1e300"), ("gemm_peak_fraction", "-0.5"), ("gemm_peak_fraction", "0"),
                       ("hbm_efficiency", "4.9e-324"), ("hbm_efficiency", "1000"), ("link_efficiency", "4.9e-324"),
                       ("link_efficiency", "50")]:
        cal = {"cal.json": f'{{"{key}": {value}}}'}
        add("calibration-out-of-range", [*est, "--calibration", f"{CASE}/cal.json"], cal)
        add("calibration-out-of-range", ["estimate", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2",
                                         "--seq-len", "64", "--calibration", f"{CASE}/cal.json"], cal)
    for item in ("PATH=/evil", "LD_PRELOAD=/tmp/x.so", "PYTHONPATH=/tmp", "HOME=/tmp", "FOO=1", "1BAD=x",
                 "A B=1", "IFS=x", "BASH_ENV=/tmp/x", "=1"):
        add("nccl-env-not-a-setting", ["emit", "--recipe", "cpu-demo", "--out", f"{CASE}/job", "--nccl-env", item])
    add("nccl-env-not-a-setting", ["emit", "--model", "tiny-gpt", *H100, "--num-gpus", "8", "--seq-len", "512",
                                   "--out", f"{CASE}/job", "--nccl-env", "PATH=/evil"])
    for hosts, n in (("n1,n1", "16"), ("node1,NODE1", "16"), ("a,b,a", "24"), ("n1,n2,n2,n3", "32")):
        add("hosts-repeated", ["emit", "--model", "tiny-gpt", *H100, "--num-gpus", n, "--seq-len", "512",
                               "--out", f"{CASE}/job", "--hosts", hosts])
    for argv in UNFIT:
        add("emit-unfit-plan", ["emit", *argv, "--out", f"{CASE}/job"])
    doc = yaml.safe_load(cpu_demo_recipe)
    for seq in (64, 256, 512, 100):
        mine = dict(doc, seq_len=seq)
        add("recipe-seq-len-differs", ["emit", "--recipe", f"{CASE}/mine.yaml", "--out", f"{CASE}/job"],
            {"mine.yaml": yaml.safe_dump(mine)})
    for gb in (17, 32):
        mine = dict(doc, global_batch=gb, plan=dict(doc["plan"], global_batch_size=gb))
        add("recipe-plan-inconsistent", ["emit", "--recipe", f"{CASE}/mine.yaml", "--out", f"{CASE}/job"],
            {"mine.yaml": yaml.safe_dump(mine)})
    for steps, warm in (("1", "1000000"), ("2", "1000000"), ("1", "101"), ("5", "100000"), ("10", "10001")):
        add("tune-warmup-absurd", [*TUNE_CPU, "--steps", steps, "--warmup-steps", warm, "--out", f"{CASE}/t"])
    for body in ("localhost slots=99999999999999999999\n", "localhost slots=100000\n",
                 "".join(f"node{i} slots=4096\n" for i in range(300)), "localhost slots=2\nlocalhost slots=2\n",
                 "localhost slots=0\n", "localhost slots=-1\n"):
        add("hostfile-bad-slots", [*TUNE_CPU, "--global-batch", "4", "--trials", "1", "--out", f"{CASE}/t",
                                   "--launcher", "deepspeed", "--hostfile", f"{CASE}/hostfile"], {"hostfile": body})
    for n in ("0", "-2"):
        add("accelerate-num-processes", ["validate", f"{CASE}/accelerate.yaml"], {"accelerate.yaml": (
            "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
            f"num_processes: {n}\nmixed_precision: bf16\n")})
    return out


# ---- "false alarm": correct real-world files validate clean --------------------------------------------------------
# file: (the job's flags, the warnings' paths the engine itself prints): tests/emit/test_realworld_corpus.py's GOOD,
# plus the flags issue 21 used (DeepSpeedExamples' AutoTP config with --hf --world-size 8).
GOOD = {
    "megatron_gpt3_175b_distributed.sh": [(["--world-size", "128"], [])],
    "megatron_llama3_8b_h100_fp8.sh": [(["--world-size", "8"], ["--sequence-parallel"])],
    "megatron_pretrain_gpt_distributed_with_mp.sh": [(["--world-size", "8"], [])],
    "megatron_pretrain_gpt.sh": [(["--world-size", "1"], [])],
    "dse_hf_integration_autotp_ds_config.json": [(["--hf", "--world-size", "4"], []),
                                                 (["--hf", "--world-size", "8"], [])],
    "dse_autotuning_ds_config_z2.json": [(["--hf", "--world-size", "8"], [])],
    "dse_autotuning_ds_config_z3.json": [(["--hf", "--world-size", "8"], [])],
    "hf_ds_config_zero2.json": [(["--hf", "--world-size", "8"], [])],
    "accelerate_deepspeed.yaml": [([], [])],
    "accelerate_fsdp.yaml": [([], [])],
    "accelerate_multi_gpu.yaml": [([], [])],
    "accelerate_tp_hsdp.yaml": [([], [])],
    "accelerate_cp.yaml": [([], [])],
    "accelerate_latest_fsdp.yaml": [([], [])],
    "torchtitan_llama3_8b.toml": [(["--world-size", "8"], [])],
    "torchtitan_llama3_70b.toml": [(["--world-size", "64"], [])],
}
GENERIC_NAMES = {".sh": "train.sh", ".json": "ds_config.json", ".yaml": "config.yaml", ".toml": "job.toml"}


def realworld_cases(good: dict[str, str]) -> list[Case]:
    """Each good file as published and renamed as a user would name it, with --json and without."""
    out = []
    for name, runs in GOOD.items():
        if name not in good:
            continue
        for flags, warnings in runs:
            for rel in (name, GENERIC_NAMES[Path(name).suffix]):
                for as_json in ([], ["--json"]):
                    out.append(Case(0, f"realworld:{name}", ["validate", f"{CASE}/{rel}", *flags, *as_json],
                                    {rel: good[name]}, expect="pass", warnings=list(warnings)))
    # Megatron arguments in a quoted string (GPT_ARGS="..."), as the older examples and many users write them
    quoted = ('#!/bin/bash\nGPT_ARGS="\n    --num-layers 24 \\\n    --hidden-size 1024 \\\n    --num-attention-heads 16 \\\n'
              '    --seq-length 1024 \\\n    --max-position-embeddings 1024 \\\n    --micro-batch-size 4 \\\n'
              '    --global-batch-size 8 \\\n    --lr 0.00015 \\\n    --train-iters 500000 \\\n    --fp16\n"\n'
              'torchrun --nproc_per_node 1 --nnodes 1 --master_addr localhost pretrain_gpt.py $GPT_ARGS '
              '--data-path /d/x_text_document --vocab-file /d/v.json --merge-file /d/m.txt --split 949,50,1\n')
    for as_json in ([], ["--json"]):
        out.append(Case(0, "realworld:quoted-GPT_ARGS", ["validate", f"{CASE}/train.sh", "--world-size", "1", *as_json],
                        {"train.sh": quoted}, expect="pass"))
    return out


def special_cases() -> list[Case]:
    """Special files as inputs and outputs (the ones random lists rarely hit); a hang shows here."""
    fifo = {"fifo.json": ["fifo"]}
    f = f"{CASE}/fifo.json"
    tune = ["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "256"]
    cases = [["estimate", "--model", f, "--gpu", "cpu", "--num-gpus", "2"],
             ["estimate", "--model", "tiny-gpt", "--cluster", f], ["emit", "--plan-json", f, "--out", f"{CASE}/a"],
             ["validate", f], ["recipes", "show", f],
             [*tune, "--out", f"{CASE}/t", "--launcher", "deepspeed", "--hostfile", f],
             [*tune, "--out", f"{CASE}/t", "--launcher", "deepspeed", "--hostfile", "/dev/zero"],
             [*tune, "--out", "/proc/autotune-campaign"], [*tune, "--out", f"{CASE}/" + "o" * 300],
             [*tune, "--out", f"{CASE}/loop"], [*tune, "--out", f"{CASE}/afile/t"],
             ["emit", "--recipe", "a" * 300, "--out", f"{CASE}/job"], ["recipes", "show", "a" * 300],
             ["recipes", "show", "/".join(["a" * 200] * 30)], ["emit", "--recipe", f"{CASE}/afile/x.yaml", "--out",
                                                             f"{CASE}/job"],
             ["emit", "--recipe", "cpu-demo", "--out", f"{CASE}/dangling", "--force"]]
    files = {**fifo, "afile": "x"}
    out = [Case(0, "special:" + a[0], a, dict(files)) for a in cases]
    for c in out:  # links are made by the runner: a symlink loop and a dangling link
        c.pre = [["@symlink", f"{CASE}/loop", f"{CASE}/loop"], ["@symlink", f"{CASE}/missing", f"{CASE}/dangling"]]
    return out


DS = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
      "zero_optimization": {"stage": 1, "reduce_bucket_size": 500000000},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.0003}}}


def hostile_file_cases(good: dict[str, str]) -> list[Case]:
    """Issue 21's traceback inputs as files: TOML integers past the int-string limit and nesting thousands deep,
    DeepSpeed JSON numbers no 64-bit type holds, what torchtitan's own loader raises on."""
    import re

    out = []
    tomls = ["[parallelism]\ntensor_parallel_degree = " + "9" * 5000 + "\n", "x = 1" + "0" * 4300 + "\n",
             "x = " + "[" * 5000 + "]" * 5000 + "\n", "x = " + "{a=" * 5000 + "}" * 5000 + "\n",
             "x = " + "[" * 40 + "]" * 40 + "\n", "[job]\ndump_folder = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n"]
    titan = good.get("torchtitan_llama3_8b.toml", "")
    for pattern, value in ((r"^steps = .*$", "steps = -" + "9" * 400), (r"^hf_assets_path = .*$",
                                                                       "hf_assets_path = 1" + "0" * 400)):
        bad, n = re.subn(pattern, value, titan, count=1, flags=re.MULTILINE)
        if n:
            tomls.append(bad)
    for body in tomls:
        out.append(Case(0, "hostile-file:torchtitan-toml", ["validate", f"{CASE}/job.toml", "--world-size", "8"],
                        {"job.toml": body}))
    for where, literal in ((("train_micro_batch_size_per_gpu",), "-1e400"), (("gradient_accumulation_steps",), "1e400"),
                           (("zero_optimization", "reduce_bucket_size"), "1e400"), (("gradient_clipping",), "1" + "0" * 400),
                           (("optimizer", "params", "lr"), "-1" + "0" * 400), (("train_batch_size",), "1" + "0" * 5000),
                           (("train_batch_size",), "1e400")):
        data = json.loads(json.dumps(DS))
        node = data
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = "@@"
        body = json.dumps(data, indent=2).replace('"@@"', literal)
        for flags in (["--world-size", "8"], ["--world-size", "8", "--hf"]):
            out.append(Case(0, "hostile-file:deepspeed-json", ["validate", f"{CASE}/ds_config.json", *flags],
                            {"ds_config.json": body}))
    return out


def dataloss_cases(seed: int) -> list[Case]:
    """emit --force over a folder holding notes.txt: killed inside the swap ('rename'), at a random time ('kill'),
    or not at all ('none'); then emitted again. The runner checks that notes.txt ('mine') is still somewhere."""
    rng = random.Random(seed + 1)
    out = []
    for mode in ["rename", "rename-noexchange", "none"] + ["kill"] * 4:
        delay = round(rng.uniform(0.5, 3.0), 2) if mode == "kill" else 0
        out.append(Case(0, f"dataloss:{mode}", ["emit", "--recipe", "cpu-demo", "--out", f"{CASE}/job", "--force"],
                        pre=[["emit", "--recipe", "cpu-demo", "--out", f"{CASE}/job"],
                             ["@write", f"{CASE}/job/notes.txt", "mine"], ["@killed-emit", mode, str(delay)],
                             ["@age", ".job.*"]],
                        expect="dataloss"))
    return out


FUZZ_SHARE = {"estimate": 600, "plan": 150, "emit": 120, "validate": 250, "recipes": 150, "tune": 250}


def build_cases(n: int, seed: int, spec: dict, fixtures: Path, cpu_demo_recipe: str, *, processes: bool = True) -> list[Case]:
    """The campaign: every fixed case (issue 21's lists) when n allows, the rest fuzz, split as tests/test_fuzz_cli.py
    splits its examples. With a small n, a seeded sample of the fixed cases is half of it."""
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
