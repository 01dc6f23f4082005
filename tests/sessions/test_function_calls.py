"""Function calls in the session core: the events of a call, what enters history, and a call
cut off by a cancel (scripted engine output through the test double)."""

from __future__ import annotations

from rtserve.engines.events import OutputToolCall
from rtserve.engines.values import ToolCall, ToolCallDelta, ToolChoice, ToolSpec
from rtserve.sessions import SessionConfig
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from tests.sessions.conftest import names, of_type, settle, take_ready
from tests.sessions.test_runner import open_session, start_response

TOOL = ToolSpec("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})
CONFIG = SessionConfig(modalities=("text",), tools=(TOOL,), tool_choice=ToolChoice("required"))


def call_piece(session, response_id: str, arguments: str, first: bool = False) -> None:
    delta = ToolCallDelta(0, arguments, "call_7" if first else None, "get_weather" if first else None)
    session.emit(OutputToolCall(delta, session.epoch, response_id))


async def test_a_call_is_an_output_item_with_argument_deltas_and_joins_history(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine, CONFIG)
    response_id = await start_response(handle, session)
    assert session.responses[-1].params.tools == (TOOL,)
    assert session.responses[-1].params.tool_choice == ToolChoice("required")
    call_piece(session, response_id, '{"ci', first=True)
    call_piece(session, response_id, 'ty":"Oslo"}')
    session.finish(response_id)
    events = await take_ready(handle.attachment)
    # The message item's done events, then the call's, then response.done.
    assert names(events)[-7:] == [
        "OutputItemDone",
        "ItemDone",
        "FunctionCallArgumentsDone",
        "OutputItemDone",
        "ItemDone",
        "ResponseDone",
        "RateLimitsUpdated",
    ]
    added = [e for e in of_type(events, ev.OutputItemAdded) if e.item.kind == "function_call"]
    assert [(e.output_index, e.item.call_id, e.item.name, e.item.status) for e in added] == [
        (1, "call_7", "get_weather", "in_progress")
    ]
    assert [e.delta for e in of_type(events, ev.FunctionCallArgumentsDelta)] == ['{"ci', 'ty":"Oslo"}']
    [args_done] = of_type(events, ev.FunctionCallArgumentsDone)
    assert (args_done.call_id, args_done.name, args_done.arguments) == ("call_7", "get_weather", '{"city":"Oslo"}')
    [done] = of_type(events, ev.ResponseDone)
    assert [(i.kind, i.status) for i in done.output] == [("text", "completed"), ("function_call", "completed")]

    # The result goes in; the next response's history holds the call and its result.
    handle.submit(cmd.FunctionItemCreate(kind="function_call_output", call_id="call_7", output="cold"))
    await settle()
    await start_response(handle, session)
    history = session.responses[-1].messages
    assert [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in history[-2:]] == [
        ("assistant", "", (ToolCall("call_7", "get_weather", '{"city":"Oslo"}'),), None),
        ("tool", "cold", (), "call_7"),
    ]


async def test_a_call_cut_off_by_a_cancel_leaves_the_conversation(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine, CONFIG)
    response_id = await start_response(handle, session)
    call_piece(session, response_id, '{"ci', first=True)
    await settle()
    handle.submit(cmd.ResponseCancel())
    events = await take_ready(handle.attachment)
    [call_done] = [e for e in of_type(events, ev.OutputItemDone) if e.item.kind == "function_call"]
    assert call_done.item.status == "incomplete"
    assert of_type(events, ev.FunctionCallArgumentsDone) == []
    [deleted] = of_type(events, ev.ItemDeleted)
    assert deleted.item_id == call_done.item.id
    [done] = of_type(events, ev.ResponseDone)
    assert done.status == "cancelled" and done.output[1].status == "incomplete"

    # Nothing of the half call reaches the next response, and its result would be refused.
    handle.submit(cmd.FunctionItemCreate(kind="function_call_output", call_id="call_7", output="x", event_id="r"))
    [error] = await take_ready(handle.attachment)
    assert isinstance(error, ev.ErrorEvent)
    assert (error.code, error.param, error.related_event_id) == ("invalid_value", "item.call_id", "r")
    await start_response(handle, session)
    assert all(not m.tool_calls for m in session.responses[-1].messages)


async def test_a_call_cut_off_by_the_token_limit_is_not_kept(engine, make_manager) -> None:
    _, handle, session = await open_session(make_manager, engine, CONFIG)
    response_id = await start_response(handle, session)
    call_piece(session, response_id, '{"city":"Os', first=True)
    session.finish(response_id)  # the engine ran out of max_output_tokens mid-call
    events = await take_ready(handle.attachment)
    [call_done] = [e for e in of_type(events, ev.OutputItemDone) if e.item.kind == "function_call"]
    assert call_done.item.status == "incomplete" and of_type(events, ev.ItemDeleted)
    assert of_type(events, ev.FunctionCallArgumentsDone) == []
