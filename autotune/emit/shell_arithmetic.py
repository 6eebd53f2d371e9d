"""bash's integer arithmetic (``$(( ))``) on the sizes launch scripts compute, for
:class:`autotune.emit.bash_reader.BashReader`: + - * / % and parentheses over integers, division truncating."""

from __future__ import annotations

import ast

__all__ = ["integer_expression"]


def integer_expression(text: str) -> int:
    """The value of an integer expression (``/`` written ``//``); ValueError, SyntaxError, ZeroDivisionError,
    RecursionError or OverflowError where it is none bash would compute here."""
    return _integer(ast.parse(text, mode="eval").body)


_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
              ast.FloorDiv: lambda a, b: abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1),  # bash truncates
              ast.Mod: lambda a, b: a - b * (abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1))}


def _integer(node: ast.AST) -> int:
    """An integer expression of + - * / % and parentheses (bash's arithmetic on the sizes scripts compute)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _integer(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _integer(node.left), _integer(node.right)
        if abs(left) > 1 << 62 or abs(right) > 1 << 62:
            raise OverflowError
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError("not an integer expression")
