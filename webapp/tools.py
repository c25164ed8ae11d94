"""Built-in tools: a safe calculator and the current time.

The calculator never calls `eval`: it parses the expression with `ast` and
walks a whitelist of nodes (numbers, ``+ - * / // % **``, unary signs,
parentheses). Every step is bounded -- expression length, literal size and
the size of every intermediate integer -- because an expression is untrusted
model output and ``9**9**9`` would otherwise pin a CPU core for hours.
A bound that trips raises `ValueError` (also for a wrong *kind* of input:
to the model every refusal is the same "bad expression", so one exception
type keeps the error results uniform); the runtime turns it into an error
result the model can read and explain.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import datetime

from webapp.runtime.tool import tool

Number = int | float

MAX_EXPRESSION_CHARS = 500
MAX_LITERAL_DIGITS = 100
# About 1,200 decimal digits: big enough for any honest arithmetic question,
# small enough that one multiplication of two bounded values is instant.
MAX_INTEGER_BITS = 4000
_LITERAL_LIMIT = 10**MAX_LITERAL_DIGITS

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_SYMBOLS: dict[type[ast.AST], str] = {
    ast.BitXor: "^ (use ** for powers)",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}


def parse_expression(expression: str) -> ast.expr:
    """Parse and validate an arithmetic expression without evaluating it.

    Raises ValueError naming what is not allowed.
    """
    if not isinstance(expression, str):
        raise ValueError(  # noqa: TRY004 -- see the module docstring
            f"expression must be a string, got {type(expression).__name__}"
        )
    text = expression.strip()
    if not text:
        raise ValueError("expression is empty; pass arithmetic such as '12*(3+4)'")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(
            f"expression is {len(text)} characters long; the limit is {MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"{text!r} is not a valid arithmetic expression ({exc.msg})") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"expression {text[:40]!r}... is nested too deeply") from None
    _check_node(tree.body)
    return tree.body


def _check_node(node: ast.AST) -> None:
    # An explicit stack instead of recursion: a long chain such as 1+1+...+1
    # is a deep tree, and validation must not hit the recursion limit.
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.BinOp):
            if type(current.op) not in _BINARY:
                raise ValueError(f"operator {_describe(current.op)} is not allowed")
            stack.extend((current.left, current.right))
        elif isinstance(current, ast.UnaryOp):
            if type(current.op) not in _UNARY:
                raise ValueError(f"operator {_describe(current.op)} is not allowed")
            stack.append(current.operand)
        elif isinstance(current, ast.Constant):
            _check_literal(current.value)
        else:
            raise ValueError(  # noqa: TRY004 -- see the module docstring
                f"{_describe(current)} is not allowed; only numbers, + - * / // % **, "
                "unary signs and parentheses are"
            )


def _check_literal(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number; only numbers are allowed")  # noqa: TRY004
    if isinstance(value, int) and abs(value) >= _LITERAL_LIMIT:
        raise ValueError(f"a number literal is longer than {MAX_LITERAL_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"a number literal is too large to represent: {value!r}")


def _describe(node: ast.AST) -> str:
    if type(node) in _SYMBOLS:
        return _SYMBOLS[type(node)]
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "a function call"
    return f"this kind of expression ({type(node).__name__})"


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 12 else f"{text[:5]}...({len(text)} digits)"


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression safely; raises ValueError on anything else."""
    node = parse_expression(expression)
    try:
        return _evaluate(node)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("the result is too large to compute") from None
    except RecursionError:
        raise ValueError("expression is nested too deeply") from None


def _evaluate(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        return node.value  # type: ignore[return-value]  # _check_literal allowed only numbers
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        _check_operation(node.op, left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    raise ValueError(f"{_describe(node)} is not allowed")  # parse_expression rejects it first


def _check_operation(op: ast.operator, left: Number, right: Number) -> None:
    """Refuse an operation whose result would be too big before computing it."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # float arithmetic overflows to OverflowError or inf, both caught later
    if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1:
        bits = right * math.log2(abs(left))
        if bits > MAX_INTEGER_BITS:
            raise ValueError(
                f"{_short(left)}**{_short(right)} would have about "
                f"{int(bits * 0.30103) + 1:,} digits; the limit is about "
                f"{int(MAX_INTEGER_BITS * 0.30103):,}"
            )
    if isinstance(op, ast.Mult) and left.bit_length() + right.bit_length() > MAX_INTEGER_BITS + 1:
        raise ValueError("the product is too large to compute")


def _bounded(value: Number) -> Number:
    if isinstance(value, complex):
        # (-8) ** 0.5 is complex in Python; arithmetic here stays real.
        raise ValueError(  # noqa: TRY004
            "the result is not a real number (e.g. a fractional power of a negative number)"
        )
    if isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS:
        raise ValueError("the result is too large to compute")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is too large to represent")
    return value


def format_number(value: Number) -> str:
    """84 rather than 84.0; short floats without binary noise (0.1+0.2 -> 0.3)."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return f"{value:.15g}"
    return str(value)


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: Arithmetic using numbers, + - * / // % **, unary signs and
            parentheses, for example "12*(3+4)".
    """
    return format_number(evaluate(expression))


@tool
def current_time() -> str:
    """Return the current local date and time in ISO 8601 format, with the time zone offset."""
    return datetime.now().astimezone().isoformat(timespec="seconds")
