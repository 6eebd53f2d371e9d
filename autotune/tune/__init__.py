"""The tuner (``autotune tune``): an Optuna study of short profiling trials on the real hardware.

It launches and judges trials (:mod:`autotune.tune.trial`) but trains nothing itself: a ``builtin`` trial
runs the plan's engine's trainer, ``python -m autotune.train`` (:mod:`autotune.train`, on the model of
:mod:`autotune.workloads.transformer`), a ``script`` trial the user's DeepSpeed script, a ``command`` trial
a shell command.
"""
