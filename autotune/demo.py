"""The README's main job: where Llama-3-70B's memory goes on 8 and on 64 H100s, then the
fastest plans for it on 128 H100s, the files that run the best one, and a short real tuning study of
a tiny model on this machine's CPU.

Runs on any machine (no GPU, no server): the cost model for the large model, real DeepSpeed (gloo, CPU)
for the tiny one.
"""

from __future__ import annotations

import sys

from autotune.cli import main as cli_main

# Each line is an `autotune` command a user could type; the demo only runs them in order.
DEMO_COMMANDS: tuple[tuple[str, ...], ...] = (
    # 8 GPUs, one node: 1.1 TB of model states cannot fit 8 x 80 GB without offload ...
    ("estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--tp", "8", "--zero", "1",
     "--seq-len", "8192", "--global-batch", "64", "--recompute", "selective"),
    # ... ZeRO-3 over 8 ranks with the optimizer in host memory does.
    ("estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--zero", "3",
     "--offload-optimizer", "cpu", "--seq-len", "8192", "--global-batch", "64", "--recompute", "full"),
    # 64 GPUs: Megatron-LM 3D parallelism (tp 8 x pp 2 x dp 4) with the distributed optimizer (ZeRO-1).
    ("estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--tp", "8", "--pp", "2",
     "--zero", "1", "--micro-batch", "1", "--global-batch", "512", "--seq-len", "8192", "--recompute", "selective",
     "--engine", "megatron"),
    # 128 GPUs: search every plan of every engine (DeepSpeed, Megatron-LM, Megatron-DeepSpeed, FSDP2, HF) and rank
    # the ones that fit; each candidate names its engine.
    ("plan", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "128", "--seq-len", "8192",
     "--global-batch", "1024"),
    # ... and write the winner's files (the recipe holds that same plan): ds_config.json or Megatron args,
    # launch scripts for torchrun, the deepspeed launcher and SLURM, the checkpoint policy, plan.md.
    ("emit", "--recipe", "llama3-70b-128xh100", "--out", "out/llama3-70b-128xh100", "--force"),
    # A short real study on this machine: tiny-gpt as 2 gloo ranks under DeepSpeed, 3 profiling trials in an
    # SQLite study (resumable; rerunning the demo continues it), calibration, and the measured winner emitted.
    ("tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--global-batch", "8",
     "--trials", "3", "--steps", "2", "--warmup-steps", "1", "--no-offload", "--engine", "deepspeed",
     "--out", "out/tune-demo", "--resume"),
)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; ``--no-tune`` skips the real tuning study (the fast mode the README test uses)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autotune.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--no-tune", action="store_true", help="skip the tuning study (cost model only, seconds)")
    args = parser.parse_args(argv)
    status = 0
    for command in DEMO_COMMANDS:
        if args.no_tune and command[0] == "tune":
            continue
        print("$ autotune " + " ".join(command))
        status = max(status, cli_main(list(command)))
        print()
    return status


if __name__ == "__main__":
    sys.exit(main())
