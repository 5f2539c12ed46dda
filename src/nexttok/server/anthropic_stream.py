"""The event stream of one /v1/messages request, in Anthropic's order (each event named by its
type on an `event:` line):

    message_start (the message, content empty), ping,
    per content block: content_block_start, content_block_delta..., content_block_stop
    message_delta (stop_reason, stop_sequence, usage), message_stop

Everything streams as it is generated, one block open at a time, indexes 0, 1, 2, ... A text
reply is a text block of text_delta events (it opens with the first text, so an empty reply has
no block, as its whole message has none). A reply that may call tools (JSON in tools.py's format)
is read by tools.ReplyStream: the text of a {"response": ...} streams as a text block the same
way; each call opens a tool_use block once its name is whole (input {}), its input follows as
input_json_delta events (the arguments' JSON as the model writes it: joined, the non-streamed
input) and the block stops when the call's JSON closes; stop_reason tool_use once the reply's
JSON is whole. A call cut by max_tokens stops where it was cut, its pieces not a whole JSON, and
the message ends with stop_reason max_tokens: what Anthropic's fine-grained tool streaming does
(the non-streamed message keeps the calls written whole and leaves the cut one out).
"""

from __future__ import annotations

from nexttok.generation.loop import Step
from nexttok.generation.tools import ReplyEvent, ReplyStream
from nexttok.server.anthropic_messages import Reply, tool_use, usage

TEXT = -1  # the open block is the text block (a call's block is its index among the calls)


class MessageEvents:
    def __init__(self, reply: Reply, prompt_tokens: int):
        self.reply, self.prompt_tokens = reply, prompt_tokens
        self.steps: list[Step] = []
        self.stream = ReplyStream() if reply.tools else None
        self.blocks = 0  # content blocks started; the last one is at index blocks - 1
        self.open: int | None = None  # the block being written: TEXT or a call's index, None between blocks

    def opening(self) -> list[dict]:
        message = self.reply.message([], (None, None), usage(self.prompt_tokens, 0))
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def step(self, step: Step) -> list[dict]:
        self.steps.append(step)
        if self.stream is None:
            return self._text(step.text) if step.text else []
        return [event for e in self.stream.feed(step.text) for event in self._tool_event(e)]

    def _text(self, text: str) -> list[dict]:
        events = [] if self.open == TEXT else self._opens(TEXT, {"type": "text", "text": ""})
        return [*events, {"type": "content_block_delta", "index": self.blocks - 1,
                          "delta": {"type": "text_delta", "text": text}}]

    def _tool_event(self, e: ReplyEvent) -> list[dict]:
        """The events for one piece of a tool reply read so far."""
        if e.kind == "content":
            return self._text(e.text)
        if e.kind == "call":
            return self._opens(e.index, tool_use(self.stream.calls[e.index].name, {}))
        if self.open != e.index:  # a call that closed before its name came: its block stops at the next one
            return []
        if e.kind == "arguments":
            return [{"type": "content_block_delta", "index": self.blocks - 1,
                     "delta": {"type": "input_json_delta", "partial_json": e.text}}]
        return self._closes()

    def _opens(self, block_of: int, block: dict) -> list[dict]:
        """The open block's stop (blocks never overlap), then the new one's start."""
        events = self._closes()
        self.open, self.blocks = block_of, self.blocks + 1
        return [*events, {"type": "content_block_start", "index": self.blocks - 1, "content_block": block}]

    def _closes(self) -> list[dict]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.blocks - 1}]

    def closing(self) -> list[dict]:
        called = self.stream is not None and self.stream.whole and bool(self.stream.calls)  # as Reply.content
        stop_reason, stop_sequence = self.reply.stop(self.steps, called)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        return [*self._closes(), {"type": "message_delta", "delta": delta,
                                  "usage": usage(self.prompt_tokens, len(self.steps))}, {"type": "message_stop"}]
