"""The job folder autotune writes for a plan: the engine's files, launch scripts, plan.json and plan.md.

Above the engines and the cost model: :func:`autotune.bundle.writer.write_bundle` asks the plan's engine for its
files (written through the format writers of ``autotune.emit``), adds the launch scripts, the checkpoint
policy (``autotune.cost.checkpoint``) and plan.md (:mod:`autotune.bundle.plan_md`), reloads every file and
writes the folder atomically.
"""
