"""The function calls one response makes, as OpenAI Realtime reports them.

Each call is its own output item after the response's message item (``output_index`` 1,
2, ...): ``response.output_item.added`` and ``conversation.item.added`` when the engine
names the call, ``response.function_call_arguments.delta`` per piece, and at the end of the
response ``response.function_call_arguments.done``, ``response.output_item.done`` and
``conversation.item.done``. A call enters history only when its response completes; the
calls of a cancelled or failed response, and a call whose arguments were cut off (by
``max_output_tokens``), leave the conversation (``response.output_item.done`` with status
``incomplete``, then ``conversation.item.deleted``).
"""

from __future__ import annotations

from rtserve import untrusted_json
from rtserve.engines.values import ToolCallDelta
from rtserve.sessions import events as ev
from rtserve.sessions.conversation import Conversation, ConversationItem, Outcome
from rtserve.sessions.ids import new_item_id
from rtserve.sessions.output import SessionOutput


class ResponseCalls:
    def __init__(self, response_id: str, turn_id: int, conversation: Conversation, output: SessionOutput) -> None:
        self._response_id = response_id
        self._turn_id = turn_id
        self._conversation = conversation
        self._output = output
        self._items: dict[int, ConversationItem] = {}  # engine call index -> item

    def on_delta(self, delta: ToolCallDelta) -> None:
        item = self._items.get(delta.index)
        session_id, emit = self._output.session_id, self._output.emit
        if item is None:
            if delta.call_id is None:
                return  # a piece of a call never named: nothing to attach it to
            item = ConversationItem(
                new_item_id(),
                "assistant",
                "function_call",
                text="",
                status="in_progress",
                turn_id=self._turn_id,
                call_id=delta.call_id,
                name=delta.name or "",
            )
            previous = self._conversation.add(item)
            self._items[delta.index] = item
            emit(
                ev.OutputItemAdded(
                    session_id=session_id,
                    response_id=self._response_id,
                    item=item.snapshot(),
                    output_index=self._index(delta.index),
                )
            )
            emit(ev.ItemAdded(session_id=session_id, item=item.snapshot(), previous_item_id=previous))
        if delta.arguments:
            item.text = (item.text or "") + delta.arguments
            emit(
                ev.FunctionCallArgumentsDelta(
                    session_id=session_id,
                    response_id=self._response_id,
                    item_id=item.id,
                    call_id=item.call_id or "",
                    delta=delta.arguments,
                    output_index=self._index(delta.index),
                )
            )

    def finish(self, outcome: Outcome) -> list[ev.SessionEvent]:
        """The done events of every call (to emit before ``response.done``)."""
        batch: list[ev.SessionEvent] = []
        session_id = self._output.session_id
        for index, item in sorted(self._items.items()):
            completed = outcome == "completed" and _is_json(item.text or "")
            item.status = "completed" if completed else "incomplete"
            if not completed:  # a half-written call is no call: it leaves the conversation
                self._conversation.remove(item.id)
            snapshot = item.snapshot()
            if completed:
                batch.append(
                    ev.FunctionCallArgumentsDone(
                        session_id=session_id,
                        response_id=self._response_id,
                        item_id=item.id,
                        call_id=item.call_id or "",
                        name=item.name or "",
                        arguments=item.text or "",
                        output_index=self._index(index),
                    )
                )
            batch.append(
                ev.OutputItemDone(
                    session_id=session_id, response_id=self._response_id, item=snapshot, output_index=self._index(index)
                )
            )
            batch.append(
                ev.ItemDone(session_id=session_id, item=snapshot)
                if completed
                else ev.ItemDeleted(session_id=session_id, item_id=item.id)
            )
        return batch

    def snapshots(self) -> tuple[ev.ItemSnapshot, ...]:
        return tuple(item.snapshot() for _, item in sorted(self._items.items()))

    @staticmethod
    def _index(call_index: int) -> int:
        return 1 + call_index  # the response's message item is output 0


def _is_json(arguments: str) -> bool:
    """Whether a call's arguments are whole (a reply cut by ``max_output_tokens`` leaves them open)."""
    try:
        untrusted_json.loads(arguments)
    except ValueError:
        return False
    return True
