"""OfflineModel: the model used when no endpoint is configured.

It lets the app work on a machine with no network or API key, and gives
tests and demos behaviour they can predict: "count to N" streams 1 .. N,
arithmetic goes through the `calculator` tool, time questions through
`current_time`, and anything else gets a short Markdown reply saying how to
connect a real model. That last reply deliberately varies between runs (a
random opener), so Regenerate visibly changes something.

The model decides from the LAST user message and from what follows it in the
request: a tool result after it means the tool already ran and it is time to
answer. Call ids are matched within the request, never remembered, because
the runtime may rewrite ids and the same instance serves many runs at once.

Asked to continue an unfinished reply (`ModelRequest.continue_final`), it
writes the rest of what it would have said -- a "count to 10" stopped at
"1 2 3" goes on with " 4 5 ... 10" -- and otherwise adds one short sentence.
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import random
import re
import uuid
from collections.abc import AsyncIterator, Sequence

from webapp.models.attached import SentUserEntry
from webapp.runtime.model import (
    FinishPart,
    ModelPart,
    ModelRequest,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from webapp.tools import evaluate, format_number, parse_expression
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)
from webapp.usage import Usage

MAX_COUNT = 10_000
_MAX_QUOTE_CHARS = 500

_COUNT = re.compile(r"\bcount\s+to\s+(\d[\d,_]*)", re.IGNORECASE)
_TIME = re.compile(
    r"\bwhat\s+time\b|\btime\s+is\s+it\b|\bcurrent\s+(?:time|date)\b"
    r"|\bwhat(?:'s|\s+is)\s+the\s+(?:time|date)\b|\btoday'?s\s+date\b|\bwhat\s+day\s+is\b",
    re.IGNORECASE,
)
# Runs of characters that can make up arithmetic, from their first digit; the
# candidates are then trimmed and validated by the calculator's own parser. A
# pattern that also matched the signs and spaces before the digit would, at every
# start in a long run of spaces without a digit, scan to its end again: quadratic
# in the message. The signs are found by looking back from the digit instead.
_ARITHMETIC_BODY = re.compile(r"\d[\d\s.+\-*/%()_]*")
_LEADING_SIGNS = "-+("
_WORD_RUN = re.compile(r"\S+")
_OPENERS = (
    "Hello! I'm the offline model, so I can only play back a few tricks.",
    "Hi there -- this is the built-in offline model speaking.",
    "Thanks for the message! I'm a stand-in model that runs without a network.",
    "Greetings from the offline model: no real language model is connected yet.",
    "You're chatting with the offline model, a small scripted stand-in.",
    "Message received! The offline model read it, but can't really understand it.",
)
_NOTHING_TO_ADD = "(That is the whole reply: the offline model has nothing to add to it.)"
_HELP = (
    "I can count (`count to 20`), do arithmetic (`what is 12*(3+4)?`) and tell the time "
    "(`what time is it?`).\n\n"
    "To talk to a real model, start the app with an OpenAI-compatible endpoint: "
    "`--base-url` (or `OPENAI_BASE_URL`) and `--model` (or `WEBAPP_MODEL`), plus "
    "`--api-key` (or `OPENAI_API_KEY`) if the endpoint needs one. For example, with Ollama:\n\n"
    "```\npython -m webapp --base-url http://localhost:11434/v1 --model llama3.2\n```\n"
)


class OfflineModel:
    """A scripted-by-rules model that streams with `delay` seconds between chunks."""

    def __init__(self, delay: float = 0.02, *, seed: int | None = None) -> None:
        if not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0:
            raise ValueError(f"delay must be a finite number of seconds >= 0, got {delay!r}")
        self.delay = float(delay)
        # A private generator: tests can pass a seed without touching global state.
        self._random = random.Random(seed)

    def __repr__(self) -> str:
        return f"OfflineModel(delay={self.delay!r})"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        input_tokens = _rough_tokens(request.system) + sum(
            _rough_tokens(_entry_text(e)) for e in request.entries
        )
        tools = {t.name for t in request.tools}
        message, after = _last_user_message(request.entries)
        answered = _answered_call(after)
        attached = _attached_text(request.entries)
        if request.continue_final:
            chunks = _continuation(message, after, attached)
        elif answered is not None:
            chunks = _split_words(_answer_for(*answered))
        else:
            action = self._decide(message, tools)
            if isinstance(action, ToolCallPart):
                await asyncio.sleep(self.delay)
                yield action
                yield UsagePart(Usage(input_tokens, _rough_tokens(action.arguments) + 5))
                yield FinishPart("tool_calls")
                return
            chunks = _split_words(attached + "\n\n") + action if attached else action
        for index, chunk in enumerate(chunks):
            if index:
                await asyncio.sleep(self.delay)
            else:
                await asyncio.sleep(0)  # a cancellation point even with delay=0
            yield TextPart(chunk)
        yield UsagePart(Usage(input_tokens, len(chunks)))
        yield FinishPart("stop")

    def _decide(self, message: str, tools: set[str]) -> ToolCallPart | list[str]:
        """A tool call to make, or the chunks of a direct reply."""
        count = _COUNT.search(message)
        if count:
            return _count_chunks(count.group(1))
        expression = find_expression(message)
        if expression is not None:
            if "calculator" in tools:
                return _call("calculator", {"expression": expression})
            # Without the tool on offer a call would fail; answer directly instead.
            return _split_words(_calculation_text(expression))
        if _TIME.search(message):
            if "current_time" in tools:
                return _call("current_time", {})
            return _split_words("I can't tell the time: the `current_time` tool is not enabled.")
        return _split_words(self._fallback_reply(message))

    def _fallback_reply(self, message: str) -> str:
        return _fallback_text(self._random.choice(_OPENERS), message)


def _fallback_text(opener: str, message: str) -> str:
    text = message.strip() or "(an empty message)"
    if len(text) > _MAX_QUOTE_CHARS:
        text = text[:_MAX_QUOTE_CHARS] + " ..."
    quote = "\n".join(f"> {line}" if line.strip() else ">" for line in text.splitlines())
    return f"{opener} You wrote:\n\n{quote}\n\n{_HELP}"


def _attached_text(entries: Sequence[Entry]) -> str:
    """What this model says about the last user message's files (SPEC §14), "" if none."""
    last = next((e for e in reversed(entries) if isinstance(e, UserEntry)), None)
    if not isinstance(last, SentUserEntry):
        return ""
    lines = []
    for file in last.sent:
        a = file.attachment
        lines.append(f"Attached: {a.name} ({a.media_type}, {a.size} bytes)")
        if file.text is not None:
            lines.append(f"{a.name} begins: {_first_line(a.name, file.text)}")
    return "\n\n".join(lines)


def _first_line(name: str, text: str) -> str:
    """The first line of a document's text as sent, its "[NAME, page P]" headings skipped."""
    for line in text.splitlines():
        line = line.strip()
        if line and not (line.startswith(f"[{name}") and line.endswith("]")):
            return line
    return ""


def _continuation(message: str, after: list[Entry], attached: str = "") -> list[str]:
    """The chunks that carry on the unfinished reply at the end of `after`.

    A reply this model could have been writing goes on from where it stopped;
    a count that ends with a number goes on from the next one; anything else
    gets one sentence in a new paragraph, so the result is always readable.
    """
    partial = "".join(e.text for e in _trailing_reply(after))
    possible = _possible_replies(message, after)
    if attached:  # the files' lines came first (see `stream`)
        head = "".join(_split_words(attached + "\n\n"))
        possible = [head + text for text in possible] + possible
    for full in possible:
        if partial and len(partial) < len(full) and full.startswith(partial):
            return _split_words(full[len(partial) :])
    count = _COUNT.search(message)
    rest = _count_rest(count.group(1), partial) if count else None
    if rest is not None:
        return rest
    return _split_words(_paragraph_break(partial) + _NOTHING_TO_ADD)


def _trailing_reply(after: list[Entry]) -> list[AssistantEntry]:
    """The assistant text at the end of `after` (one reply, maybe saved in pieces)."""
    tail: list[AssistantEntry] = []
    for entry in reversed(after):
        if isinstance(entry, AssistantEntry):
            tail.insert(0, entry)
        elif not isinstance(entry, ReasoningEntry):
            break
    return tail


def _possible_replies(message: str, after: list[Entry]) -> list[str]:
    """Every text this model streams for `message`, exactly as it streams it."""
    answered = _answered_call(after)
    if answered is not None:
        texts = [_answer_for(*answered)]
    else:
        count = _COUNT.search(message)
        expression = find_expression(message)
        texts = ["".join(_count_chunks(count.group(1)))] if count else []
        texts += [_calculation_text(expression)] if expression is not None else []
        texts += [_fallback_text(opener, message) for opener in _OPENERS]
    return ["".join(_split_words(text)) for text in texts]


def _count_rest(raw: str, partial: str) -> list[str] | None:
    """The numbers after the last one in `partial`, up to the count's limit, if any are left."""
    limit = _count_limit(raw)
    # Read from the end by hand: a pattern anchored at "$" would be tried at every
    # digit of a long run of digits, each time to the run's end.
    text = partial.rstrip()
    digits = len(text) - len(text.rstrip("0123456789"))
    if limit is None or not digits or digits > 6 or int(text[-digits:]) >= limit:
        return None
    start = int(text[-digits:]) + 1
    return [f"{'' if len(text) < len(partial) else ' '}{start}"] + [
        f" {n}" for n in range(start + 1, limit + 1)
    ]


def _paragraph_break(partial: str) -> str:
    newlines = len(partial) - len(partial.rstrip("\n"))
    return "\n" * max(0, 2 - newlines) if partial.strip() else ""


def find_expression(text: str) -> str | None:
    """The longest arithmetic expression with at least one operator in `text`, if any."""
    best: str | None = None
    for match in _ARITHMETIC_BODY.finditer(text):
        candidate = _trim_candidate(text[_run_start(text, match.start()) : match.end()])
        if candidate is None:
            continue
        if best is None or len(candidate) > len(best):
            best = candidate
    return best


def _run_start(text: str, digit: int) -> int:
    """Where the run whose first digit is at ``digit`` starts: the signs and opening
    parentheses before it, then the spaces between them and the digit. The previous
    run ended on a character that is neither, so no character is looked at twice."""
    start = digit
    while start > 0 and text[start - 1].isspace():
        start -= 1
    while start > 0 and text[start - 1] in _LEADING_SIGNS:
        start -= 1
    return start


def _trim_candidate(raw: str) -> str | None:
    text = raw.strip().rstrip(".+-*/%( ").strip()
    # Prose around an expression leaves unbalanced parentheses: "(about 2+2)". The
    # counts are kept as the ends move, so a long run of them costs one pass.
    opens, closes = text.count("("), text.count(")")
    start, end = 0, len(text)
    while closes > opens and end > start and text[end - 1] == ")":
        end, closes = end - 1, closes - 1
        while end > start and text[end - 1].isspace():
            end -= 1
    while opens > closes and start < end and text[start] == "(":
        start, opens = start + 1, opens - 1
        while start < end and text[start].isspace():
            start += 1
    text = text[start:end]
    try:
        node = parse_expression(text)
    except ValueError:
        return None
    # A bare number ("-5", "(3)") is not a question for the calculator.
    return text if isinstance(node, ast.BinOp) else None


def _count_limit(raw: str) -> int | None:
    """The N of "count to N", or None when it is more than this model counts to."""
    digits = raw.replace(",", "").replace("_", "")
    return None if len(digits) > 6 or int(digits) > MAX_COUNT else int(digits)


def _count_chunks(raw: str) -> list[str]:
    limit = _count_limit(raw)
    if limit is None:
        return _split_words(
            f"I can count to at most {MAX_COUNT:,}; {raw} is more than that. Try a smaller number."
        )
    if limit < 1:
        return ["There is nothing to count to 0."]
    return ["1"] + [f" {n}" for n in range(2, limit + 1)]


def _call(name: str, arguments: dict[str, str]) -> ToolCallPart:
    return ToolCallPart(f"call_offline_{uuid.uuid4().hex[:16]}", name, json.dumps(arguments))


def _calculation_text(expression: str) -> str:
    try:
        return f"{expression} = {format_number(evaluate(expression))}"
    except ValueError as exc:
        return f"I could not calculate {expression}: {exc}"


def _answer_for(call: ToolCallEntry, result: ToolResultEntry) -> str:
    if call.name == "calculator":
        expression = _argument(call.arguments, "expression")
        if result.is_error:
            return f"I could not calculate {expression}: {result.output}"
        return f"{expression} = {result.output}"
    if call.name == "current_time":
        if result.is_error:
            return f"I could not read the clock: {result.output}"
        return f"The current time is {result.output}."
    verb = "failed" if result.is_error else "returned"
    return f"The tool `{call.name}` {verb}: {result.output}"


def _argument(arguments: str, key: str) -> str:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments
    return str(value.get(key, arguments)) if isinstance(value, dict) else arguments


def _last_user_message(entries: Sequence[Entry]) -> tuple[str, list[Entry]]:
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if isinstance(entry, UserEntry):
            return entry.text, list(entries[index + 1 :])
    return "", list(entries)


def _answered_call(after: list[Entry]) -> tuple[ToolCallEntry, ToolResultEntry] | None:
    """The last tool call after the user message that has its result, if any."""
    calls = {e.call_id: e for e in after if isinstance(e, ToolCallEntry)}
    for entry in reversed(after):
        if isinstance(entry, ToolResultEntry) and entry.call_id in calls:
            return calls[entry.call_id], entry
    return None


def _split_words(text: str) -> list[str]:
    """Each word with the space before it (trailing space is dropped). Cut at the
    words' ends, not matched as "space, then a word": that pattern would scan a
    long trailing run of spaces once from each of its positions."""
    ends = [m.end() for m in _WORD_RUN.finditer(text)]
    return [text[a:b] for a, b in zip([0, *ends], ends)] or [text]


def _entry_text(entry: Entry) -> str:
    if isinstance(entry, (UserEntry, AssistantEntry, ReasoningEntry)):
        return entry.text
    if isinstance(entry, ToolCallEntry):
        return entry.name + entry.arguments
    return entry.output


def _rough_tokens(text: str) -> int:
    return (len(text) + 3) // 4
