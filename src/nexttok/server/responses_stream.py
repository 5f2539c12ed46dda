"""The event stream of one /v1/responses request, in the order OpenAI documents (each event has a
`type` and a `sequence_number`, 0, 1, 2, ...).

A text reply streams as it is generated: one response.output_text.delta per step that releases
text. A reply that may call tools (JSON in tools.py's format) streams as it is generated too,
read by tools.ReplyStream: a function_call item opens once its name is written, its arguments
follow as response.function_call_arguments.delta events, and the message it may turn out to be
streams its text; a call cut by max_output_tokens closes "incomplete".
"""

from __future__ import annotations

from nexttok.generation.loop import Step
from nexttok.generation.tools import ReplyEvent, ReplyStream
from nexttok.server.responses_items import ResponseBuilder, new_id, usage


class ResponseEvents:
    def __init__(self, builder: ResponseBuilder, prompt_tokens: int):
        self.builder, self.prompt_tokens = builder, prompt_tokens
        self.steps: list[Step] = []
        self.sequence = 0
        self.final: dict | None = None
        self.reply = ReplyStream() if builder.tools else None
        self.items: list[dict] = []  # a tool reply's items, in the order they opened
        self.by_call: dict[int, dict] = {}  # a call's index in the reply -> its item

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": f"response.{kind}" if kind != "error" else "error", "sequence_number": self.sequence,
                 **fields}
        self.sequence += 1
        return event

    def opening(self) -> list[dict]:
        response = self.builder.response("in_progress", [], None)
        events = [self._event("created", response=response), self._event("in_progress", response=response)]
        if not self.builder.tools:
            events += self._message_opens(0)
        return events

    def _message_opens(self, index: int) -> list[dict]:
        b = self.builder
        item = {"id": b.message_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        return [self._event("output_item.added", output_index=index, item=item),
                self._event("content_part.added", item_id=b.message_id, output_index=index, content_index=0,
                            part=b.text_part("", None if b.logprobs is None else []))]

    def step(self, step: Step) -> list[dict]:
        self.steps.append(step)
        if self.reply is not None:
            return [event for e in self.reply.feed(step.text) for event in self._tool_event(e)]
        if not (step.text or self.builder.logprobs is not None):
            return []
        logprobs = self.builder.token_logprobs([step]) if self.builder.logprobs is not None else []
        return [self._event("output_text.delta", item_id=self.builder.message_id, output_index=0, content_index=0,
                            delta=step.text, logprobs=logprobs)]

    def _tool_event(self, e: ReplyEvent) -> list[dict]:
        """The events for one piece of a tool reply read so far."""
        if e.kind == "content":
            events = []
            if not self.items:
                self.items.append(self.builder.message("", "in_progress", None))
                events += self._message_opens(0)
            self.items[0]["content"][0]["text"] += e.text
            return events + [self._event("output_text.delta", item_id=self.items[0]["id"], output_index=0,
                                         content_index=0, delta=e.text, logprobs=[])]
        call = self.reply.calls[e.index]
        if e.kind == "call":
            item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call.id,
                    "name": call.name, "arguments": ""}
            self.by_call[e.index] = item
            self.items.append(item)
            return [self._event("output_item.added", output_index=len(self.items) - 1, item=dict(item))]
        item = self.by_call[e.index]
        index = self.items.index(item)
        if e.kind == "arguments":
            item["arguments"] += e.text
            return [self._event("function_call_arguments.delta", item_id=item["id"], output_index=index, delta=e.text)]
        return self._call_closes(index, item, "completed")

    def _call_closes(self, index: int, item: dict, status: str) -> list[dict]:
        item["status"] = status
        return [self._event("function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"]),
                self._event("output_item.done", output_index=index, item=dict(item))]

    def closing(self) -> list[dict]:
        b, steps = self.builder, self.steps
        if self.reply is not None and self.items:
            return self._tool_closing()
        items, events = b.items(steps), []
        if not b.tools:
            events += self._message_closes(0, items[0])
        elif items:  # a tool reply that streamed nothing: an empty {"response": ""}
            events += self._message_opens(0) + self._message_closes(0, items[0])
        status = b.status(steps)
        self.final = b.response(status, items, usage(self.prompt_tokens, steps))
        events.append(self._event("completed" if status == "completed" else "incomplete", response=self.final))
        return events

    def _tool_closing(self) -> list[dict]:
        """The end of a streamed tool reply: its message closes, a call cut short closes incomplete."""
        status, events = self.builder.status(self.steps), []
        for index, item in enumerate(self.items):
            if item["type"] == "message":
                item["status"] = status
                events += self._message_closes(index, item)
            elif item["status"] == "in_progress":
                events += self._call_closes(index, item, "incomplete")
        self.final = self.builder.response(status, self.items, usage(self.prompt_tokens, self.steps))
        events.append(self._event("completed" if status == "completed" else "incomplete", response=self.final))
        return events

    def _message_closes(self, index: int, item: dict) -> list[dict]:
        part = item["content"][0]
        return [self._event("output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=part["text"], logprobs=part.get("logprobs", [])),
                self._event("content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part),
                self._event("output_item.done", output_index=index, item=item)]

    def error(self, message: str) -> dict:
        return self._event("error", code="server_error", message=message, param=None)
