"""The README's main job: where Llama-3-70B's memory goes on 8 and on 64 H100s, then the
fastest plans for it on 128 H100s, the files that run the best one, and a short real tuning study of
a tiny model on this machine's CPU.

Runs on any machine (no GPU, no server): the cost model for the large model, real DeepSpeed (gloo, CPU)
for the tiny one.
"""

from __future__ import annotations

import sys
from textwrap import fill as wrap

from autotune.cli import main as cli_main

# Each step: what it shows (printed first, so nothing surprising reads as a failure), then an `autotune` command
# a user could type; the demo only runs them in order.
DEMO_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Llama-3-70B on 8 H100: does not fit, on purpose: with tensor parallelism and ZeRO-1 each GPU still holds a "
     "share of 1.1 TB of model states plus 8k-token activations, about 200 GiB against 80; the ledger shows which "
     "term is too big.",
     ("estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--tp", "8", "--zero", "1",
      "--seq-len", "8192", "--global-batch", "64", "--recompute", "selective")),
    ("The same 8 H100, made to fit: ZeRO-3 shards the weights over the 8 ranks and the optimizer states move to "
     "host memory (the 'host per node' row is the price: over 1 TB of CPU memory).",
     ("estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--zero", "3",
      "--offload-optimizer", "cpu", "--seq-len", "8192", "--global-batch", "64", "--recompute", "full")),
    ("64 H100: Megatron-LM 3D parallelism (tp 8 x pp 2 x dp 4) with the distributed optimizer (ZeRO-1) fits "
     "without offload, at about 12 times the tokens/s of step 2 on 8 times the GPUs.",
     ("estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--tp", "8", "--pp", "2",
      "--zero", "1", "--micro-batch", "1", "--global-batch", "512", "--seq-len", "8192", "--recompute", "selective",
      "--engine", "megatron")),
    ("128 H100: every plan of every engine (DeepSpeed, Megatron-LM, Megatron-DeepSpeed, FSDP2, HF) searched and the "
     "ones that fit ranked by predicted tokens/s; each names its engine (seconds).",
     ("plan", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "128", "--seq-len", "8192",
      "--global-batch", "1024")),
    ("The winner's files (the llama3-70b-128xh100 recipe holds that same plan): ds_config.json or Megatron "
     "arguments, launch scripts for torchrun, the deepspeed launcher and SLURM, the checkpoint policy, plan.md, and "
     "under fallback/ the plan to resume on if a node is lost (resume_fallback.sh).",
     ("emit", "--recipe", "llama3-70b-128xh100", "--out", "out/llama3-70b-128xh100", "--force")),
    ("A real tuning study on this machine: tiny-gpt as 2 gloo ranks under DeepSpeed, 3 profiling trials in an "
     "SQLite study, then the best plans re-run, calibration, and the measured winner's files. About 5 minutes on "
     "2 cores; the first run on a machine also builds DeepSpeed's shm_comm op once (1-6 minutes, said as it "
     "goes). Rerunning the demo resumes the study and finishes in seconds.",
     ("tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--global-batch", "8",
      "--trials", "3", "--steps", "2", "--warmup-steps", "1", "--no-offload", "--engine", "deepspeed",
      "--out", "out/tune-demo", "--resume")),
)
DEMO_COMMANDS: tuple[tuple[str, ...], ...] = tuple(command for _, command in DEMO_STEPS)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; ``--no-tune`` skips the real tuning study (the fast mode the README test uses)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autotune.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--no-tune", action="store_true", help="skip the tuning study (cost model only, seconds)")
    args = parser.parse_args(argv)
    status = 0
    steps = [(text, command) for text, command in DEMO_STEPS if not (args.no_tune and command[0] == "tune")]
    for i, (text, command) in enumerate(steps, 1):
        print(wrap(f"# Step {i} of {len(steps)}. {text}", width=110, subsequent_indent="# "))
        print("$ autotune " + " ".join(command), flush=True)
        status = max(status, cli_main(list(command)))
        print()
    return status


if __name__ == "__main__":
    sys.exit(main())
