"""torchtitan's Qwen3 and GPT-OSS flavors, read from its source with ``ast`` (torchtitan.models imports torchdata,
which this environment may lack), as the fields autotune's cost model reads: ``flavors_022(root)`` for v0.2.2
(``qwen3_args`` / ``gptoss_configs``: model-args dataclasses), ``flavors_030(root)`` for 0.3.0 (builder functions
per flavor); ``root`` is the ``torchtitan`` package folder. ``preset_fields(spec)`` gives the same fields of an
autotune ModelSpec. Nothing is executed: keyword literals, local constants and dataclass defaults only."""

from __future__ import annotations

import ast
from pathlib import Path

FIELDS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "dense_ffn", "vocab", "tied", "qk_norm", "moe",
          "sliding_window", "sliding_layers", "sinks", "activation_clamp", "attention_bias")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _value(node: ast.AST, scope: dict):
    if isinstance(node, ast.Name):
        return scope[node.id]
    return ast.literal_eval(node)


def _kwargs(call: ast.Call, scope: dict | None = None) -> dict:
    """A call's keywords whose values are literals (or names in ``scope``); nested calls as their ast.Call."""
    out = {}
    for kw in call.keywords:
        if isinstance(kw.value, ast.Call):
            out[kw.arg] = kw.value
            continue
        try:
            out[kw.arg] = _value(kw.value, scope or {})
        except (ValueError, KeyError, TypeError):
            out[kw.arg] = kw.value
    return out


def _class_defaults(path: Path, name: str, holding: str | None = None) -> dict:
    """Literal field defaults of the first class ``name`` in ``path`` (that declares ``holding``, when given:
    0.3.0 nests a ``Config`` in every module class)."""
    for cls in (n for n in ast.walk(_tree(path)) if isinstance(n, ast.ClassDef) and n.name == name):
        out = {}
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                try:
                    out[stmt.target.id] = ast.literal_eval(stmt.value)
                except ValueError:
                    pass
        if holding is None or holding in out:
            return out
    raise LookupError(f"no class {name} with {holding} in {path}")


def _module_dict(tree: ast.Module, name: str) -> ast.Dict:
    return next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets))


def _calls(node: ast.AST, callee: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and ast.unparse(n.func) == callee]


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _locals(fn: ast.FunctionDef) -> dict:
    out = {}
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                out[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            except ValueError:
                pass
    return out


def _every_other(expr: ast.AST, layers: int) -> tuple[int, ...]:
    """The layers a ``layer_id % 2 == 0`` test picks (the only pattern GPT-OSS uses; anything else fails)."""
    assert ast.unparse(expr) == "layer_id % 2 == 0", ast.unparse(expr)
    return tuple(range(0, layers, 2))


def _biased(node: ast.AST) -> bool:
    """Whether any call under ``node`` passes ``bias=True`` (the attention projections' constructors)."""
    return any(isinstance(n, ast.keyword) and n.arg == "bias" and isinstance(n.value, ast.Constant)
               and n.value.value is True for n in ast.walk(node))


def _attention_class(path: Path) -> ast.ClassDef:
    return next(n for n in ast.walk(_tree(path)) if isinstance(n, ast.ClassDef) and n.name == "Attention")


def _moe(experts, top_k, width, shared, router_bias) -> dict:
    return {"experts": experts, "top_k": top_k, "expert_ffn": width, "shared_experts": shared,
            "router_bias": router_bias, "dense_layers": 0}


def flavors_022(root: Path) -> dict[tuple[str, str], dict]:
    """{(model name, flavor): fields} of torchtitan v0.2.2's qwen3 and gpt_oss registries."""
    out = {}
    moe_defaults = _class_defaults(root / "models/moe/moe.py", "MoEArgs")
    defaults = _class_defaults(root / "models/qwen3/model/args.py", "Qwen3ModelArgs")
    table = _module_dict(_tree(root / "models/qwen3/__init__.py"), "qwen3_args")
    q_norm = next(n.value for n in ast.walk(_tree(root / "models/qwen3/model/model.py"))
                  if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "self.q_norm"
                  and isinstance(n.value, ast.Call))
    per_head = ast.unparse(q_norm.args[0]) == "self.head_dim"  # one RMSNorm of head_dim (model.py:172-178)
    bias = _biased(_attention_class(root / "models/qwen3/model/model.py"))
    for key, call in zip(table.keys, table.values):
        a = defaults | _kwargs(call)
        moe = moe_defaults | _kwargs(a["moe_args"]) if a.get("moe_enabled") else None
        # every block is MoE when moe_enabled (models/qwen3/model/model.py:366-376)
        out["qwen3", key.value] = {
            "hidden": a["dim"], "layers": a["n_layers"], "heads": a["n_heads"], "kv_heads": a["n_kv_heads"],
            "head_dim": a["head_dim"], "dense_ffn": None if moe else a["hidden_dim"], "vocab": a["vocab_size"],
            "tied": a["enable_weight_tying"], "qk_norm": ("head" if per_head else "full") if a["qk_norm"] else None,
            "moe": moe and _moe(moe["num_experts"], moe["top_k"], a["moe_inter_dim"], moe["num_shared_experts"],
                                moe["gate_bias"]),
            "sliding_window": None, "sliding_layers": None, "sinks": False, "activation_clamp": None,
            "attention_bias": bias}
    defaults = _class_defaults(root / "models/gpt_oss/model/args.py", "GptOssModelArgs")
    bias = _biased(_attention_class(root / "models/gpt_oss/model/model.py"))
    model = _tree(root / "models/gpt_oss/model/model.py")
    sliding = next(n.value for n in ast.walk(model) if isinstance(n, ast.Assign)
                   and ast.unparse(n.targets[0]) == "self.use_sliding_attention")
    sinks = any(isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "self.sinks" for n in ast.walk(model))
    # the output layer is a Linear of its own (no weight tying anywhere in the gpt_oss package)
    tied = "tying" in (root / "models/gpt_oss/model/model.py").read_text()
    table = _module_dict(_tree(root / "models/gpt_oss/__init__.py"), "gptoss_configs")
    for key, call in zip(table.keys, table.values):
        a = defaults | _kwargs(call)
        moe = moe_defaults | _kwargs(a["moe_args"])
        out["gpt_oss", key.value] = {
            "hidden": a["dim"], "layers": a["n_layers"], "heads": a["n_heads"], "kv_heads": a["n_kv_heads"],
            "head_dim": a["head_dim"], "dense_ffn": None, "vocab": a["vocab_size"], "tied": tied, "qk_norm": None,
            "moe": _moe(moe["num_experts"], moe["top_k"], a["moe_inter_dim"], moe["num_shared_experts"],
                        moe["gate_bias"]),
            "sliding_window": a["sliding_window_size"], "sliding_layers": _every_other(sliding, a["n_layers"]),
            "sinks": sinks, "activation_clamp": a["swiglu_limit"], "attention_bias": bias}
    return out


def _registry(tree: ast.Module, name: str) -> dict[str, ast.FunctionDef]:
    table = _module_dict(tree, name)
    return {k.value: _function(tree, v.id) for k, v in zip(table.keys, table.values)}


def flavors_030(root: Path) -> dict[tuple[str, str], dict]:
    """{(model package, flavor): fields} of torchtitan 0.3.0's qwen3 and gpt_oss model registries."""
    out = {}
    tree = _tree(root / "models/qwen3/__init__.py")
    tied_default = _class_defaults(root / "models/common/decoder.py", "Config",
                                   "enable_weight_tying")["enable_weight_tying"]
    moe_builder = _function(tree, "_build_qwen3_moe_layers")
    router = _kwargs(_calls(moe_builder, "make_router_config")[0])
    router_bias = router.get("bias", _signature_defaults(_function(
        _tree(root / "models/common/config_utils.py"), "make_router_config"))["bias"])
    shared = 1 if _calls(moe_builder, "make_moe_config") and "shared_experts" in _kwargs(
        _calls(moe_builder, "make_moe_config")[0]) else 0
    bias = _biased(_function(_tree(root / "models/common/config_utils.py"), "make_gqa_config"))
    for flavor, fn in _registry(tree, "qwen3_configs").items():
        if not _calls(fn, "Qwen3Model.Config"):
            continue  # a variant of another flavor's config (debugmodel_non_fused_qkv)
        scope = _locals(fn)
        top = _kwargs(_calls(fn, "Qwen3Model.Config")[0], scope)
        dense = _calls(fn, "_build_qwen3_layers")
        a = _kwargs((dense or _calls(fn, "_build_qwen3_moe_layers"))[0], scope)
        out["qwen3", flavor] = {
            "hidden": a["dim"], "layers": a["n_layers"], "heads": a["n_heads"], "kv_heads": a["n_kv_heads"],
            "head_dim": a["head_dim"], "dense_ffn": a["hidden_dim"] if dense else None, "vocab": top["vocab_size"],
            "tied": top.get("enable_weight_tying", tied_default), "qk_norm": _qk_norm(dense, moe_builder, tree),
            "moe": None if dense else _moe(a["num_experts"], a["top_k"], a["moe_hidden_dim"], shared, router_bias),
            "sliding_window": None, "sliding_layers": None, "sinks": False, "activation_clamp": None,
            "attention_bias": bias}
    tree = _tree(root / "models/gpt_oss/__init__.py")
    builder = _function(tree, "_build_gptoss_layers")
    attn = _signature_defaults(_function(tree, "_make_gptoss_attn_config"))
    bias = _biased(_function(tree, "_make_gptoss_attn_config"))
    attn_call = _kwargs(_calls(builder, "_make_gptoss_attn_config")[0])
    window = attn_call["sliding_window_size"]  # `128 if layer_id % 2 == 0 else None`
    gate = _kwargs(_calls(_calls(builder, "TokenChoiceTopKRouter.Config")[0], "Linear.Config")[0])
    clamp = _class_defaults(root / "models/gpt_oss/moe.py", "Config", "swiglu_limit")["swiglu_limit"]
    sinks = "self.sinks = nn.Parameter" in (root / "models/gpt_oss/model.py").read_text()
    for flavor, fn in _registry(tree, "gptoss_configs").items():
        scope = _locals(fn)
        top = _kwargs(_calls(fn, "GptOssModel.Config")[0], scope)
        a = _kwargs(_calls(fn, "_build_gptoss_layers")[0], scope)
        heads = {k: attn_call.get(k, attn[k]) for k in ("n_heads", "n_kv_heads", "head_dim")}
        out["gpt_oss", flavor] = {
            "hidden": a["dim"], "layers": a["n_layers"], "heads": heads["n_heads"], "kv_heads": heads["n_kv_heads"],
            "head_dim": heads["head_dim"], "dense_ffn": None, "vocab": top["vocab_size"],
            "tied": top.get("enable_weight_tying", tied_default), "qk_norm": None,
            "moe": _moe(a["num_experts"], a["top_k"], a["hidden_dim"], 0, gate.get("bias", False)),
            "sliding_window": ast.literal_eval(window.body), "sliding_layers": _every_other(window.test, a["n_layers"]),
            "sinks": sinks, "activation_clamp": clamp, "attention_bias": bias}
    return out


def _signature_defaults(fn: ast.FunctionDef) -> dict:
    args = fn.args
    pairs = list(zip(args.args[len(args.args) - len(args.defaults):], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    out = {}
    for arg, default in pairs:
        try:
            out[arg.arg] = ast.literal_eval(default)
        except ValueError:
            pass
    return out


def _qk_norm(dense: list, moe_builder: ast.FunctionDef, tree: ast.Module) -> str | None:
    """"head" where the block builder passes a qk_norm of head_dim (``qk_norm=_qwen3_norm(head_dim)``)."""
    builder = _function(tree, "_build_qwen3_layers") if dense else moe_builder
    calls = _calls(builder, "make_gqa_config")
    norm = _kwargs(calls[0]).get("qk_norm")
    return "head" if isinstance(norm, ast.Call) and ast.unparse(norm) == "_qwen3_norm(head_dim)" else None


def preset_fields(spec) -> dict:
    """The same fields of an autotune ModelSpec (autotune.specs.model)."""
    moe = spec.moe
    return {
        "hidden": spec.hidden_size, "layers": spec.num_layers, "heads": spec.num_attention_heads,
        "kv_heads": spec.num_kv_heads or spec.num_attention_heads, "head_dim": spec.attention_head_dim,
        "dense_ffn": spec.ffn_hidden_size if moe is None or moe.num_dense_layers else None,
        "vocab": spec.vocab_size, "tied": spec.tied_embeddings, "qk_norm": spec.qk_norm,
        "moe": moe and _moe(moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size, moe.num_shared_experts,
                            moe.router_bias) | {"dense_layers": moe.num_dense_layers},
        "sliding_window": spec.sliding_window,
        "sliding_layers": tuple(spec.sliding_window_layers) if spec.sliding_window_layers is not None else None,
        "sinks": spec.attention_sinks, "activation_clamp": spec.activation_clamp,
        "attention_bias": spec.linear_bias or spec.qkv_bias}
