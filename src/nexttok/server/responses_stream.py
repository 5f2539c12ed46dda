"""The event stream of one /v1/responses request, in the order OpenAI documents (each event has a
`type` and a `sequence_number`, 0, 1, 2, ...).

A text reply streams as it is generated: one response.output_text.delta per step that releases
text. A reply that may call tools is held back (it is JSON in tools.py's format until it is whole)
and its items are sent at the end: function calls, or the message it turned out to be.
"""

from __future__ import annotations

from nexttok.generation.loop import Step
from nexttok.server.responses_items import ResponseBuilder, usage


class ResponseEvents:
    def __init__(self, builder: ResponseBuilder, prompt_tokens: int):
        self.builder, self.prompt_tokens = builder, prompt_tokens
        self.steps: list[Step] = []
        self.sequence = 0
        self.final: dict | None = None

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
        if self.builder.tools or not (step.text or self.builder.logprobs is not None):
            return []
        logprobs = self.builder.token_logprobs([step]) if self.builder.logprobs is not None else []
        return [self._event("output_text.delta", item_id=self.builder.message_id, output_index=0, content_index=0,
                            delta=step.text, logprobs=logprobs)]

    def closing(self) -> list[dict]:
        b, steps = self.builder, self.steps
        items, events = b.items(steps), []
        if not b.tools:
            events += self._message_closes(0, items[0])
        for index, item in enumerate(items if b.tools else []):
            if item["type"] == "function_call":
                events += self._call_events(index, item)
            else:
                events += self._message_opens(index)
                text = item["content"][0]["text"]
                events.append(self._event("output_text.delta", item_id=item["id"], output_index=index,
                                          content_index=0, delta=text, logprobs=[]))
                events += self._message_closes(index, item)
        status = b.status(steps)
        self.final = b.response(status, items, usage(self.prompt_tokens, steps))
        events.append(self._event("completed" if status == "completed" else "incomplete", response=self.final))
        return events

    def _message_closes(self, index: int, item: dict) -> list[dict]:
        part = item["content"][0]
        return [self._event("output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=part["text"], logprobs=part.get("logprobs", [])),
                self._event("content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part),
                self._event("output_item.done", output_index=index, item=item)]

    def _call_events(self, index: int, item: dict) -> list[dict]:
        opened = {**item, "status": "in_progress", "arguments": ""}
        return [self._event("output_item.added", output_index=index, item=opened),
                self._event("function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=item["arguments"]),
                self._event("function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"]),
                self._event("output_item.done", output_index=index, item=item)]

    def error(self, message: str) -> dict:
        return self._event("error", code="server_error", message=message, param=None)
