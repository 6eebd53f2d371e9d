"""The model a plan trains on, and measurements taken on it (not a trainer: no entry point here runs a plan).

Three folders share "what a trial runs"; each has one job:

- :mod:`autotune.train`: the built-in trainers, ``python -m autotune.train --plan plan.json``, one module
  per engine (``deepspeed``, ``fsdp``, ``hf``). Emitted bundles launch it and every ``--workload builtin``
  trial runs it; it prints the PHASE / STEP / RESULT lines the tuner reads.
- :mod:`autotune.workloads` (here): what those trainers and the tests build and measure:
  :mod:`~autotune.workloads.transformer` (a real decoder-only transformer from a ModelSpec),
  :mod:`~autotune.workloads.measure` (activation bytes autograd really keeps),
  :mod:`~autotune.workloads.ds_state_bytes` (the model-state bytes a DeepSpeed engine really holds),
  :mod:`~autotune.workloads.ds_memory_probe`, :mod:`~autotune.workloads.ds_checkpoint_resume` and
  :mod:`~autotune.workloads.ledger_check` (DeepSpeed runs that check the memory ledger and checkpoints).
- :mod:`autotune.tune`: the tuner, which launches trials (the trainer, the user's script or a command),
  watches and judges them; it trains nothing itself.
"""
