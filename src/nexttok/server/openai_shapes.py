"""OpenAI's response shapes, built from Step records (nothing here recomputes what a Step holds): the
model cards, usage, token logprobs, and the whole responses and stream chunks of /v1/completions and
/v1/chat/completions (CompletionFormat, ChatFormat, ToolCallFormat)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from nexttok.generation.loop import Step
from nexttok.generation.scoring import PromptScores
from nexttok.generation.tools import ReplyEvent, ReplyStream, read_reply


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def model_card(served) -> dict:
    return {"id": served.name, "object": "model", "created": served.created, "owned_by": "nexttok",
            "max_model_len": served.context_length}


def stored_card(manifest) -> dict:
    """A stored model not loaded yet (its context is known once it is)."""
    return {"id": manifest.name, "object": "model", "created": int(manifest.modified.timestamp()),
            "owned_by": "nexttok"}


def token_logprobs(tokenizer, steps: list[Step], top: int) -> list[dict]:
    """Each step as {token, logprob, bytes, top_logprobs: [its top alternatives]}: the entries of
    chat's logprobs.content and of the Responses API's output_text.logprobs."""
    def entry(token_id: int, text: str, logprob: float) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(tokenizer.decode_bytes([token_id]))}
    return [{**entry(s.token_id, s.token_text, s.logprob),
             "top_logprobs": [entry(a.id, a.text, a.logprob) for a in s.top[:top]]} for s in steps]


class ResponseFormat:
    """One request's response shape: whole responses, stream chunks and choices from Steps."""

    object_name = ""
    chunk_object = ""
    prefix = ""

    def __init__(self, model_name: str, tokenizer, *, logprobs: bool, top_logprobs: int = 0):
        self.model, self.tokenizer = model_name, tokenizer
        self.logprobs, self.top_logprobs = logprobs, top_logprobs
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def response(self, choices: list[dict], usage: Usage) -> dict:
        return {**self._envelope(self.object_name), "choices": choices, "usage": usage.as_dict()}

    def usage_chunk(self, usage: Usage) -> dict:
        return {**self._envelope(self.chunk_object), "choices": [], "usage": usage.as_dict()}

    def choice(self, index: int, steps: list[Step]) -> dict:
        """Choice `index` of a whole response, from all its steps."""
        raise NotImplementedError

    def start_chunks(self, index: int) -> list[dict]:
        """Chunks that open choice `index` of a stream."""
        raise NotImplementedError

    def step_chunk(self, index: int, step: Step, offset: int) -> dict | None:
        """The chunk of one step of choice `index`, whose text so far is `offset` characters long
        (None: nothing to send)."""
        raise NotImplementedError


class CompletionFormat(ResponseFormat):
    """/v1/completions: logprobs as {tokens, token_logprobs, top_logprobs, text_offset}; with echo,
    each choice starts with its prompt (and the prompt's own logprobs, the first token's null)."""

    object_name = chunk_object = "text_completion"
    prefix = "cmpl"

    def __init__(self, *args, echo: bool = False, prompt_logprobs: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.echo, self.prompt_logprobs = echo, prompt_logprobs
        self.prompts: dict[int, tuple[str, PromptScores | None]] = {}

    def prompt(self, index: int, text: str, scores: PromptScores | None) -> None:
        """Choice `index`'s prompt: its text (echo) and its scores (filled by the prefill, before the
        choice's first step or its end), where the request asked for them."""
        self.prompts[index] = (text, scores)

    def envelope(self) -> dict:
        return self._envelope(self.chunk_object)

    def _logprobs(self, steps, offset: int = 0) -> dict | None:
        """text_offset: where each token's text starts in the choice's whole text (a stream's
        chunk starts at `offset`, the length of the text sent before it)."""
        if not self.logprobs:
            return None
        offsets, position = [], offset
        for step in steps:
            offsets.append(position)
            position += len(step.text)
        return {"tokens": [s.token_text for s in steps], "token_logprobs": [s.logprob for s in steps],
                "top_logprobs": [{a.text: a.logprob for a in s.top} for s in steps],
                "text_offset": offsets}

    def _echoed_logprobs(self, index: int) -> dict | None:
        text, scores = self.prompts[index]
        if not self.logprobs:
            return None
        tokens = scores.tokens if scores is not None else []
        return {"tokens": [t.text for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [None if t.logprob is None else {a.text: a.logprob for a in t.top[: self.top_logprobs]}
                                 for t in tokens],
                "text_offset": [min(t.offset, len(text)) for t in tokens]}

    def _vllm_prompt_logprobs(self, index: int) -> list[dict | None]:
        """vLLM's prompt_logprobs: per prompt token None (the first) or {id: {logprob, rank,
        decoded_token}} for the token itself and the top prompt_logprobs alternatives."""
        entries = []
        for t in self.prompts[index][1].tokens:
            if t.logprob is None:
                entries.append(None)
                continue
            entry = {str(t.id): {"logprob": t.logprob, "rank": t.rank, "decoded_token": t.text}}
            for rank, a in enumerate(t.top[: self.prompt_logprobs], start=1):
                entry.setdefault(str(a.id), {"logprob": a.logprob, "rank": rank, "decoded_token": a.text})
            entries.append(entry)
        return entries

    def _with_prompt(self, index: int, choice: dict, steps, first: bool) -> dict:
        """The choice with its prompt before it (echo) and vLLM's prompt_logprobs (first: the
        choice's first or only chunk, which carries them)."""
        if self.echo:
            prompt, before = self.prompts[index][0], self._echoed_logprobs(index)
            after = self._logprobs(steps, len(prompt))
            choice["text"] = prompt + choice["text"]
            choice["logprobs"] = None if before is None else {key: before[key] + after[key] for key in before}
        if self.prompt_logprobs is not None and first:
            choice["prompt_logprobs"] = self._vllm_prompt_logprobs(index)
        return choice

    def choice(self, index: int, steps) -> dict:
        """Choice `index` from its steps (none when max_tokens was 0)."""
        choice = {"index": index, "text": "".join(s.text for s in steps), "logprobs": self._logprobs(steps),
                  "finish_reason": steps[-1].finish_reason if steps else "length"}
        return self._with_prompt(index, choice, steps, True) if index in self.prompts else choice

    def start_chunks(self, index: int) -> list[dict]:
        if index not in self.prompts:
            return []
        choice = self._with_prompt(index, {"index": index, "text": "", "logprobs": self._logprobs([]),
                                           "finish_reason": None}, [], True)
        return [{**self._envelope(self.chunk_object), "choices": [choice]}]

    def step_chunk(self, index: int, step, offset: int) -> dict | None:
        if not step.text and not step.finish_reason and not self.logprobs:
            return None
        choice = {"index": index, "text": step.text, "logprobs": self._logprobs([step], offset),
                  "finish_reason": step.finish_reason}
        return {**self._envelope(self.chunk_object), "choices": [choice]}


class ChatFormat(ResponseFormat):
    """/v1/chat/completions: logprobs as {content: [{token, logprob, bytes, top_logprobs}]}."""

    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    prefix = "chatcmpl"

    def _logprobs(self, steps) -> dict | None:
        return {"content": token_logprobs(self.tokenizer, steps, self.top_logprobs)} if self.logprobs else None

    def choice(self, index: int, steps) -> dict:
        message = {"role": "assistant", "content": "".join(s.text for s in steps)}
        return {"index": index, "message": message, "logprobs": self._logprobs(steps),
                "finish_reason": steps[-1].finish_reason}

    def start_chunks(self, index: int) -> list[dict]:
        choice = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}
        return [{**self._envelope(self.chunk_object), "choices": [choice]}]

    def step_chunk(self, index: int, step, offset: int) -> dict | None:
        if not step.text and not step.finish_reason and not self.logprobs:
            return None
        delta = {"content": step.text} if step.text or not step.finish_reason else {}
        choice = {"index": index, "delta": delta, "logprobs": self._logprobs([step]),
                  "finish_reason": step.finish_reason}
        return {**self._envelope(self.chunk_object), "choices": [choice]}


class ToolCallFormat(ChatFormat):
    """/v1/chat/completions with tools: the reply (JSON in tools.py's format) read back into
    OpenAI's `tool_calls` (finish_reason "tool_calls") or `content`. A stream sends them as they
    are generated (tools.ReplyStream): the response's text as content deltas, a call's id and name
    once its name is written, then its arguments' JSON in pieces, as OpenAI streams
    tool_calls[i].function.arguments. A reply cut by max_tokens ends with finish_reason "length"
    (a non-streamed one never shows the JSON).
    legacy: the request used the deprecated `functions`: one `function_call`, finish_reason
    "function_call"."""

    def __init__(self, *args, legacy: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.streams: dict[int, ReplyStream] = {}
        self.legacy = legacy

    def _calls(self, calls: list[dict]) -> tuple[dict, str]:
        """(the message fields of the calls, the finish reason)."""
        if self.legacy:
            return {"function_call": calls[0]["function"]}, "function_call"
        return {"tool_calls": calls}, "tool_calls"

    def choice(self, index: int, steps) -> dict:
        content, calls = read_reply("".join(s.text for s in steps))
        fields, finish = self._calls(calls) if calls else ({}, steps[-1].finish_reason)
        message = {"role": "assistant", "content": content, **fields}
        return {"index": index, "message": message, "logprobs": self._logprobs(steps), "finish_reason": finish}

    def step_chunk(self, index: int, step, offset: int) -> dict | None:
        stream = self.streams.setdefault(index, ReplyStream())
        delta = self._delta(stream, stream.feed(step.text))
        finish = None
        if step.finish_reason:
            whole = step.finish_reason != "length"
            finish = ("function_call" if self.legacy else "tool_calls") if stream.calls and whole else \
                step.finish_reason
        if not delta and finish is None:
            return None
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**self._envelope(self.chunk_object), "choices": [choice]}

    def _delta(self, stream: ReplyStream, events: list[ReplyEvent]) -> dict:
        """One chunk's delta for what a step added: content, and each call's opening and argument pieces."""
        delta: dict = {}
        calls: dict[int, dict] = {}
        for e in events:
            if e.kind == "content":
                delta["content"] = delta.get("content", "") + e.text
            elif e.kind in ("call", "arguments"):
                call = stream.calls[e.index]
                item = calls.setdefault(e.index, {"index": e.index, "function": {}})
                if e.kind == "call":
                    item.update(id=call.id, type="function")
                    item["function"].update(name=call.name, arguments="")
                else:
                    item["function"]["arguments"] = item["function"].get("arguments", "") + e.text
        if calls and self.legacy:  # one function_call, no index or id
            delta["function_call"] = next(iter(calls.values()))["function"]
        elif calls:
            delta["tool_calls"] = list(calls.values())
        return delta
