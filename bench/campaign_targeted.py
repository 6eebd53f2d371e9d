"""bench/hostile_campaign.py's targeted cases: issue 21's refusals ("nonsense accepted", with variants), the
correct real-world files that must validate clean ("false alarm"), special files, hostile file contents and
emit --force kills ("data loss"). The generic parts (Case, fuzz cases, classification) are in campaign_cases.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

from campaign_cases import CASE, Case


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
    # copied alone, without the DeepSpeed JSON it names: validate says that JSON was not checked
    "accelerate_deepspeed.yaml": [([], ["$.deepspeed_config.deepspeed_config_file"])],
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
