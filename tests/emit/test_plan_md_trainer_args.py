"""plan.md's TrainingArguments line, built as a user's own Trainer script would copy it, fills ds_config_hf.json's
"auto" optimizer with the plan's values (transformers' HfTrainerDeepSpeedConfig): without them the Trainer ran at
its defaults (lr 5e-5, no weight decay, beta2 0.999) while the plan said 3e-4, 0.1, 0.95."""

import ast
import re

from autotune.cli import main
from autotune.emit.options import OptimizerOptions


def test_the_trainer_line_of_plan_md_gives_deepspeed_the_plans_optimizer(tmp_path, capsys):
    assert main(["emit", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "hf",
                 "--zero", "2", "--out", str(tmp_path / "job")]) == 0
    capsys.readouterr()
    line = next(ln for ln in (tmp_path / "job" / "plan.md").read_text().splitlines()
                if ln.startswith("- Trainer: TrainingArguments("))
    kwargs = {k: ast.literal_eval(v) for k, v in
              re.findall(r"(\w+)=('[^']*'|[^,);\s]+)", line.split("TrainingArguments(", 1)[1])}
    kwargs["deepspeed"] = kwargs["deepspeed"].replace("<bundle>", str(tmp_path / "job"))
    from transformers import TrainingArguments

    config = TrainingArguments(**kwargs, use_cpu=True).hf_deepspeed_config.config
    o = OptimizerOptions()
    assert config["optimizer"]["params"] == {"lr": o.lr, "betas": list(o.betas), "eps": o.eps,
                                             "weight_decay": o.weight_decay}
    assert config["gradient_clipping"] == o.grad_clip
    assert (kwargs["warmup_steps"], kwargs["max_steps"]) == (o.warmup_steps, o.train_steps)  # the schedule's "auto"
