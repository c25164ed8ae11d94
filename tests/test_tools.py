"""The built-in tools: a calculator that cannot be abused, and the clock."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from webapp.runtime.tool import RunContext
from webapp.tools import calculator, current_time, evaluate, format_number
from webapp.transcript import ToolCallEntry


async def call_tool(tool: object, arguments: str) -> tuple[str, bool]:
    result = await tool.invoke(RunContext("r1", None), ToolCallEntry("c1", tool.name, arguments))  # type: ignore[attr-defined]
    assert result.call_id == "c1"
    return result.output, result.is_error


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("12*(3+4)", "84"),
        ("168/2", "84"),  # an integral float prints without ".0"
        ("7/2", "3.5"),
        ("7//2", "3"),
        ("-7 % 3", "2"),
        ("2**10", "1024"),
        ("2**-2", "0.25"),
        ("-(3 - 5)", "2"),
        ("+4", "4"),
        ("0.1 + 0.2", "0.3"),
        (" 1_000 * 3 ", "3000"),
        ("2**3999 // 2**3998", "2"),
        ("1.5e3", "1500"),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, expected: str) -> None:
    assert calculator.function(expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("9**9**9", "digits; the limit"),
        ("2**100000", "digits; the limit"),
        ("(10**99)**40", "digits; the limit"),
        ("9.0**9**9", "too large"),
        ("1" * 101, "longer than 100 digits"),
        ("1+" * 300 + "1", "characters long; the limit is 500"),
        ("1e400", "too large to represent"),
        ("1e300*1e300", "too large to represent"),
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("(-8)**0.5", "not a real number"),
        ("__import__('os').system('true')", "function call is not allowed"),
        ("x + 1", "name 'x' is not allowed"),
        ("2^3", "use ** for powers"),
        ("1 << 4000", "<< is not allowed"),
        ("True + 1", "not a number"),
        ("'a' * 3", "not a number"),
        ("[1, 2]", "is not allowed"),
        ("(1).real", "is not allowed"),
        ("lambda: 1", "is not allowed"),
        ("1 +", "not a valid arithmetic expression"),
        ("   ", "empty"),
    ],
)
def test_calculator_refuses_with_a_clear_message(expression: str, message: str) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError) as caught:
        evaluate(expression)
    assert message in str(caught.value)
    assert time.monotonic() - started < 0.5, "a refused expression must be refused quickly"


def test_long_chains_within_the_limit_evaluate_without_recursion_trouble() -> None:
    assert evaluate("1+" * 249 + "1") == 250
    assert evaluate("-" * 499 + "1") == -1


def test_big_but_bounded_results_are_computed_exactly() -> None:
    assert calculator.function("10**100 * 10**100") == "1" + "0" * 200
    assert len(calculator.function("2**3999")) == 1204


@pytest.mark.parametrize(
    ("value", "text"), [(84.0, "84"), (-3.0, "-3"), (2.5, "2.5"), (1e20, "1e+20"), (7, "7")]
)
def test_format_number(value: float, text: str) -> None:
    assert format_number(value) == text


async def test_calculator_as_a_tool_returns_text_or_an_error_result() -> None:
    assert await call_tool(calculator, '{"expression": "12*(3+4)"}') == ("84", False)
    output, is_error = await call_tool(calculator, '{"expression": "9**9**9"}')
    assert is_error
    assert output.startswith("ValueError: 9**387420489 would have about")


def test_calculator_schema_tells_the_model_what_to_send() -> None:
    assert calculator.name == "calculator"
    assert calculator.parameters["required"] == ["expression"]
    assert calculator.parameters["properties"]["expression"]["type"] == "string"
    assert "12*(3+4)" in calculator.parameters["properties"]["expression"]["description"]


async def test_current_time_is_iso_8601_with_a_time_zone() -> None:
    output, is_error = await call_tool(current_time, "{}")
    assert not is_error
    parsed = datetime.fromisoformat(output)
    assert parsed.tzinfo is not None, output
    assert abs(parsed - datetime.now().astimezone()) < timedelta(seconds=5)
    assert current_time.parameters == {"type": "object", "properties": {}}
