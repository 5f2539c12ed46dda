"""The event stream of one /v1/messages request, in Anthropic's order (each event named by its
type on an `event:` line):

    message_start (the message, content empty), ping,
    per content block: content_block_start, content_block_delta..., content_block_stop
    message_delta (stop_reason, stop_sequence, usage), message_stop

A text reply streams as it is generated: one text_delta per step that releases text (the block
opens with the first text, so an empty reply has no block, as its whole message has none). A
reply that may call tools is held back (JSON in tools.py's format until it is whole), then sent
as its blocks: tool_use blocks, each input as input_json_delta events (tool_use_events), or the
text block it turned out to be.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from nexttok.generation.loop import Step
from nexttok.server.anthropic_messages import Reply, usage


class MessageEvents:
    def __init__(self, reply: Reply, prompt_tokens: int):
        self.reply, self.prompt_tokens = reply, prompt_tokens
        self.steps: list[Step] = []
        self.text_open = False  # the text block of a reply without tools has started

    def opening(self) -> list[dict]:
        message = self.reply.message([], (None, None), usage(self.prompt_tokens, 0))
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def step(self, step: Step) -> list[dict]:
        self.steps.append(step)
        if self.reply.tools or not step.text:
            return []
        events = [] if self.text_open else [_block_start(0, {"type": "text", "text": ""})]
        self.text_open = True
        return [*events, _text_delta(0, step.text)]

    def closing(self) -> list[dict]:
        content = self.reply.content(self.steps)
        events = [_block_stop(0)] if self.text_open else []
        for index, block in enumerate(content if self.reply.tools else []):
            events += block_events(index, block)
        stop_reason, stop_sequence = self.reply.stop(self.steps, content)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        return [*events, {"type": "message_delta", "delta": delta, "usage": usage(self.prompt_tokens, len(self.steps))},
                {"type": "message_stop"}]


def block_events(index: int, block: dict) -> list[dict]:
    """A whole content block as its events."""
    if block["type"] == "tool_use":
        return list(tool_use_events(index, block, [json.dumps(block["input"], ensure_ascii=False)]))
    return [_block_start(index, {**block, "text": ""}), _text_delta(index, block["text"]), _block_stop(index)]


def tool_use_events(index: int, block: dict, partial_json: Iterable[str]) -> Iterator[dict]:
    """A tool_use block's events: its start (input {}), one input_json_delta per piece of its
    input's JSON text, its stop. The pieces are whole inputs today; pieces that arrive as the
    arguments are generated can be fed here as they come."""
    yield _block_start(index, {**block, "input": {}})
    for piece in partial_json:
        yield {"type": "content_block_delta", "index": index,
               "delta": {"type": "input_json_delta", "partial_json": piece}}
    yield _block_stop(index)


def _block_start(index: int, block: dict) -> dict:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _text_delta(index: int, text: str) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


def _block_stop(index: int) -> dict:
    return {"type": "content_block_stop", "index": index}
