"""Context policy: archive, shortened view, recall -- what makes trimming recoverable."""

from __future__ import annotations

from webapp import Agent, ContextPolicy, FileResultStore, Runner, tool
from webapp.models import ScriptedModel
from webapp.transcript import ToolResultEntry

BIG = "".join(f"line {i}\n" for i in range(2000))


@tool
def dump() -> str:
    """Return a large output."""
    return BIG


async def test_long_outputs_are_archived_shortened_for_the_model_and_recallable(stores, tmp_path):
    policy = ContextPolicy(result_store=FileResultStore(tmp_path / "archive"), max_view_chars=100)
    model = ScriptedModel(
        [[("dump", {})], "summary", [("recall_tool_result", {"call_id": "PLACEHOLDER"})], "ok"]
    )
    agent = Agent("a", model=model, tools=[dump], context_policy=policy)
    first = await Runner.run(agent, "dump it", session=stores.session, session_id="s")
    call_id = first.entries[1].call_id
    # the stored transcript keeps the full output; the model saw a shortened one
    assert first.entries[2] == ToolResultEntry(call_id, BIG)
    seen = model.requests[1][-1]
    assert seen.output.startswith(BIG[:100]) and len(seen.output) < 300
    assert f'recall_tool_result("{call_id}")' in seen.output
    assert "recall_tool_result" in model.tools[0]

    # the session is trimmed; the archive still restores the original
    trimmed = await stores.session.trim_tool_results("s", keep_chars=10, keep_runs=0)
    assert trimmed == 1
    assert len((await stores.session.load("s"))[2].output) < 400

    model.turns[2] = [("recall_tool_result", {"call_id": call_id})]
    second = await Runner.run(agent, "show the full output", session=stores.session, session_id="s")
    recalled = second.entries[2]
    assert recalled == ToolResultEntry(recalled.call_id, BIG)
    # a recall result is shown whole, or the model could never read it
    assert model.requests[3][-1].output == BIG


async def test_context_state_rides_in_the_head_and_the_segment_meta(stores, tmp_path):
    policy = ContextPolicy(result_store=FileResultStore(tmp_path / "a"))
    agent = Agent(
        "a",
        model=ScriptedModel([[("dump", {})], "x", [("dump", {})], "y"]),
        tools=[dump],
        context_policy=policy,
    )
    await Runner.run(agent, "one", session=stores.session, session_id="s")
    await Runner.run(agent, "two", session=stores.session, session_id="s")
    metas = [s.meta for s in await stores.session.segments("s")]
    assert metas == [{"context_state": {"archived": 1}}, {"context_state": {"archived": 2}}]


async def test_recall_of_an_unarchived_call_is_an_error_result(tmp_path):
    policy = ContextPolicy(result_store=FileResultStore(tmp_path))
    agent = Agent(
        "a",
        model=ScriptedModel([[("recall_tool_result", {"call_id": "../../etc/passwd"})], "no"]),
        context_policy=policy,
    )
    result = await Runner.run(agent, "x", session_id="s")
    assert result.entries[2].is_error and "no archived output" in result.entries[2].output
