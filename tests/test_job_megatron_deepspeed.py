"""A Megatron-DeepSpeed launch script read as the fork runs it (deepspeedai/Megatron-DeepSpeed@4efb479d
megatron/arguments.py, megatron/model/transformer.py; its examples_deepspeed scripts use these flags):
--checkpoint-activations, DeepSpeed-Ulysses' --ds-sequence-parallel-size, the --use-flash-attn* kernels, and
DeepSpeed-MoE's --num-experts / --topk / --expert-interval with the fork's defaults."""

import json

import pytest

from autotune.cli import main

SCRIPT = ("deepspeed --num_gpus 8 pretrain_gpt.py --num-layers 12 --hidden-size 768 --num-attention-heads 12 "
          "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 16 "
          "--vocab-size 50257 --fp16 --deepspeed --deepspeed_config ds.json --zero-stage 1 "
          "--no-pipeline-parallel {extra}\n")
DS = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
      "fp16": {"enabled": True}}


def _estimate(tmp_path, capsys, extra: str, ds: dict = DS) -> tuple[dict, str]:
    (tmp_path / "run.sh").write_text(SCRIPT.format(extra=extra))
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    code = main(["estimate", "--from", str(tmp_path / "run.sh"), str(tmp_path / "ds.json"), "--gpu", "h100-sxm-80gb",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def test_checkpoint_activations_is_full_recompute(tmp_path, capsys):
    got, _ = _estimate(tmp_path, capsys, "--checkpoint-activations --use-flash-attn-v2")
    assert got["plan"]["recompute"] == "full"  # "none" before (what emit writes for full recompute)
    plain, _ = _estimate(tmp_path, capsys, "--use-flash-attn-v2")
    assert plain["plan"]["recompute"] == "none"
    assert got["memory"]["activations"] < 0.6 * plain["memory"]["activations"]  # the logits stay


def test_ulysses_size_is_context_parallelism(tmp_path, capsys):
    # dp = 8 / sp 4 = 2: 16 = 1 x 8 accumulation x 2 (refused before: "16 != 1 x 2 x dp 8")
    got, _ = _estimate(tmp_path, capsys, "--ds-sequence-parallel-size 4 --use-flash-attn-v2",
                       {**DS, "gradient_accumulation_steps": 8})
    assert (got["plan"]["cp"], got["plan"]["dp"], got["plan"]["grad_accum_steps"]) == (4, 2, 8)


@pytest.mark.parametrize("flag, fused", [("", False), ("--use-flash-attn-v2", True), ("--use-flash-attn", True),
                                         ("--use-flash-attn-triton", True)])
def test_attention_is_fused_only_where_a_flag_asks(flag, fused, tmp_path, capsys):
    got, err = _estimate(tmp_path, capsys, flag)
    assert got["plan"]["flash_attention"] is fused
    assert ("unfused attention" in err) is not fused


def test_deepspeed_moe_is_read_with_the_forks_defaults(tmp_path, capsys):
    got, err = _estimate(tmp_path, capsys, "--num-experts 64 --use-flash-attn-v2")
    moe = got["model"]["spec"]["moe"]
    # --expert-interval 2: layers 2, 4, ... 12 (transformer.py:1650-1660); --topk 1; DeepSpeed's bias-free gate
    assert (moe["num_experts"], moe["top_k"], moe["moe_layer_step"], moe.get("router_bias", False)) == (64, 1, 2, False)
    assert moe["expert_ffn_hidden_size"] == 4 * 768  # the dense MLP's default width (arguments.py:287-296)
    expert = 2 * 768 * 3072 + 3072 + 768  # fc1 and fc2 with their biases
    assert got["model"]["num_params"] - 64 * 6 * expert < 0.2e9  # 6 MoE layers, not 12
    assert "drops tokens over capacity factor 1.0" in err
    pyramid, err = _estimate(tmp_path, capsys, "--num-experts 32 32 32 32 64 64 --topk 2 --expert-interval 2 "
                                               "--disable-moe-token-dropping --use-flash-attn-v2")
    assert (pyramid["model"]["spec"]["moe"]["num_experts"], pyramid["model"]["spec"]["moe"]["top_k"]) == (64, 2)
    assert "pyramid MoE" in err and "drops tokens" not in err


def test_one_expert_is_the_dense_model(tmp_path, capsys):
    got, _ = _estimate(tmp_path, capsys, "--num-experts 1 --use-flash-attn-v2")
    assert got["model"]["spec"].get("moe") is None  # refused before: "'<' not supported between 'NoneType' and 'int'"


def test_gpt2_bpe_vocabulary_and_swiglu_width_defaults(tmp_path, capsys):
    text = SCRIPT.replace("--vocab-size 50257", "--tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json "
                          "--merge-file gpt2-merges.txt --swiglu")
    (tmp_path / "run.sh").write_text(text.format(extra="--use-flash-attn-v2"))
    (tmp_path / "ds.json").write_text(json.dumps(DS))
    code = main(["estimate", "--from", str(tmp_path / "run.sh"), str(tmp_path / "ds.json"), "--gpu", "h100-sxm-80gb",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    model = json.loads(out)["model"]["spec"]
    # 8h/3 down to a multiple of 64 (Megatron-LM arguments.py:1280-1289, the fork's :287-296): 2048, not 4h
    assert (model["vocab_size"], model["ffn_hidden_size"]) == (50257, 2048)
