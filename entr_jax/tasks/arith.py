"""Safe evaluation of arithmetic expressions (the calculator tool and the arithmetic data).

Only numbers and ``+ - * / ** % //``, unary ``+``/``-`` and parentheses are accepted. The
expression is parsed with `ast` (never ``eval``) and evaluated exactly with
`fractions.Fraction`, so ``0.1 + 0.2`` is ``3/10`` and ``48/2`` is ``24``.

Limits (all raise `ArithmeticError_` with a message a model can read):

* ``max_chars``: longest accepted expression (characters);
* ``max_exponent``: largest ``|b|`` in ``a ** b`` (``b`` must be an integer);
* ``max_magnitude``: largest ``|value|`` of any intermediate result;
* ``max_nodes``: largest number of AST nodes.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
from fractions import Fraction


class ArithmeticError_(ValueError):
    """The expression is not accepted or cannot be evaluated (message says why)."""


@dataclasses.dataclass(frozen=True)
class ArithLimits:
    """Limits of `safe_eval` (see the module docstring)."""

    max_chars: int = 200
    max_exponent: int = 64
    max_magnitude: float = 1e30
    max_nodes: int = 100

    def __post_init__(self):
        for name in ("max_chars", "max_exponent", "max_nodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ArithLimits.{name} must be >= 1, got {getattr(self, name)}")
        if not self.max_magnitude > 0:
            raise ValueError(f"ArithLimits.max_magnitude must be > 0, got {self.max_magnitude}")


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def safe_eval(expr: str, limits: ArithLimits = ArithLimits()) -> Fraction:
    """Evaluates an arithmetic expression exactly.

    Args:
      expr: e.g. ``"48/2"``, ``"(3 + 4) * -2"``, ``"2**10 % 7"``. Thousands separators
        (``1,000``) are removed first; ``x``/``×`` are not accepted (use ``*``).
      limits: see `ArithLimits`.

    Returns:
      The exact value as a `Fraction`.

    Raises:
      ArithmeticError_: on syntax errors, names, calls, any other node type, division by
        zero, non-integer or too-large exponents, or magnitudes above the limit.
    """
    if not isinstance(expr, str):
        raise ArithmeticError_(f"expression must be a string, got {type(expr).__name__}")
    text = expr.strip().replace(",", "")
    if not text:
        raise ArithmeticError_("empty expression")
    if len(text) > limits.max_chars:
        raise ArithmeticError_(f"expression longer than {limits.max_chars} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ArithmeticError_(f"invalid syntax: {text!r}") from None
    if sum(1 for _ in ast.walk(tree)) > limits.max_nodes:
        raise ArithmeticError_(f"expression has more than {limits.max_nodes} nodes")
    return _eval(tree.body, limits)


def _check(value: Fraction, limits: ArithLimits) -> Fraction:
    if abs(value) > limits.max_magnitude:
        raise ArithmeticError_(f"magnitude exceeds {limits.max_magnitude:g}")
    return value


def _eval(node: ast.AST, limits: ArithLimits) -> Fraction:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ArithmeticError_(f"unsupported constant {node.value!r}")
        return _check(Fraction(str(node.value)), limits)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand, limits)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left = _eval(node.left, limits)
        right = _eval(node.right, limits)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1:
                raise ArithmeticError_("exponent must be an integer")
            if abs(right) > limits.max_exponent:
                raise ArithmeticError_(f"exponent larger than {limits.max_exponent}")
            if left == 0 and right < 0:
                raise ArithmeticError_("division by zero")
            # Bound the result before computing it: |left|**|right| > max  <=>  overflow.
            if abs(left) > 1 and right > 0 and _log_ge(abs(left), int(right), limits):
                raise ArithmeticError_(f"magnitude exceeds {limits.max_magnitude:g}")
            return _check(left ** int(right), limits)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ArithmeticError_("division by zero")
        return _check(Fraction(_BINOPS[type(node.op)](left, right)), limits)
    raise ArithmeticError_(f"unsupported syntax: {type(node).__name__}")


def _log_ge(base: Fraction, exponent: int, limits: ArithLimits) -> bool:
    """True when ``base ** exponent`` exceeds the magnitude limit (``base > 1``)."""
    return exponent * math.log(float(base)) > math.log(limits.max_magnitude)


def format_number(value: Fraction, max_significant: int = 10) -> str:
    """Formats a value for the model: ``"24"``, ``"-3"``, ``"2.5"``, ``"0.3333333333"``.

    Integers are printed exactly; other values as a decimal with at most
    ``max_significant`` significant digits (``%g`` style, no exponent below 1e16).
    """
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.{max_significant}g}"
    if "e" in text:
        text = f"{float(value):.{max_significant}f}".rstrip("0").rstrip(".")
    return text
