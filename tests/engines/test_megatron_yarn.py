"""MLA models' YaRN in the megatron engine's files: DeepSeek-V3's (x40, mscale_all_dim 1) is said in full by
Megatron-LM's flags; Kimi-K2's beta_fast 1 has no Megatron-LM flag under MLA, so plan.md says megatron_args.sh runs
Megatron-core's 32 there and the Bridge files (whose MLA mapping reads beta_fast) the model's own."""

from __future__ import annotations

from autotune.api import make_plan
from autotune.emit.checkpoint import CheckpointSettings
from autotune.emit.megatron_attention import mla_yarn_gaps
from autotune.emit.options import EmitOptions
from autotune.engines import engine_for
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.model import ModelSpec


def _needs(model: ModelSpec) -> tuple[str, ...]:
    cluster = load_cluster(gpu="gb200", num_gpus=256, gpus_per_node=64)
    plan = make_plan(model, cluster, engine="megatron", pp=4, vpp=4, ep=64, zero_stage=1, global_batch_size=4096,
                     seq_len=4096, precision="fp8", fp8_recipe="te-mxfp8")
    files = engine_for("megatron").render_files(model, cluster, plan, EmitOptions(), CheckpointSettings(save_dir="/ckpt", interval_steps=100, async_save=True), {})
    return files.user_script_needs


def test_kimis_beta_fast_is_named_where_megatron_lm_cannot_set_it():
    assert mla_yarn_gaps(load_model("deepseek-v3")) == []
    assert mla_yarn_gaps(load_model("kimi-k2")) == ["yarn_beta_fast 1 (MLATransformerConfig: 32)"]
    assert not any("YaRN" in n for n in _needs(load_model("deepseek-v3")))
    assert any("beta_fast 1" in n and "Megatron-Bridge files" in n for n in _needs(load_model("kimi-k2")))
