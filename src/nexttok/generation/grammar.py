"""Constrained decoding: a sampler stage that leaves only the tokens a grammar allows next.

The grammar → token-mask engine is llguidance (MIT, no dependencies, a Rust wheel for Linux CPUs),
picked by measuring on the default model's 49,152-token vocabulary (bench/grammar.py): mask +
advance 30-80 µs a token against a ~18 ms decode step; xgrammar was faster per token (25-33 µs) but
pulls in triton (~1 GB) and transformers at run time; outlines-core builds a regex index per schema
(30-70 ms) and was slower on nested objects (117 µs). The engine is fed our tokenizer's vocabulary
(each id's bytes) and our encoder, so its view of the tokens is exactly ours.

    constraint = Constraint.json_schema(tokenizer, vocab_size, schema, stop_ids)
    chain = SamplerChain.from_params(params, ..., constraint=constraint)  # "grammar" runs first

A Constraint is one request's state (its matcher advances with every accepted token): make a new one
per generation with `Constraint.json_schema` / `json_object`.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence

import torch

from nexttok.errors import InvalidParameter
from nexttok.tokenizers.tokenizer import Tokenizer

NEG_INF = float("-inf")
# JSON laid out as models usually write it ({"a": 1, "b": [2, 3]}), with no free whitespace: a
# model that may add spaces or newlines anywhere can fill its whole budget with them
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# How deep objects and arrays may nest in a schema a user gives (--json-schema, response_format, a
# tool's parameters). llguidance reads JSON with serde_json, which stops at 128 levels, and wraps a
# schema in 4 more: 124 is the deepest it compiles (measured), the limit Constraint.json_schema names.
# A tool's parameters sit 9 levels inside the reply schema (tools.reply_schema): 100 leaves room
MAX_SCHEMA_DEPTH = 100
ENGINE_SCHEMA_DEPTH = 124
_SHIFTS = torch.arange(32, dtype=torch.int32)
_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {(n, stops): LLTokenizer}


def _llguidance():
    try:
        import llguidance
    except ImportError:  # a declared dependency; a broken install still gets one clear line
        raise InvalidParameter("response_format", "constrained decoding needs the llguidance package "
                               "(pip install llguidance)") from None
    return llguidance


class _Wrapped:
    """Our tokenizer as llguidance's TokenizerWrapper reads one: every id's bytes, the stop ids,
    and an encoder (for the tokens a grammar forces)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_ids: Sequence[int]):
        known = min(vocab_size, tokenizer.vocab_size)
        self.tokens = [_bytes_of(tokenizer, i) for i in range(known)] + [b""] * (vocab_size - known)
        self.eos_token_id, self.bos_token_id = stop_ids[0], None
        self.special_token_ids = sorted(i for i in tokenizer.special_ids if i < vocab_size)
        self._tokenizer = tokenizer
        # SentencePiece-style tokenizers put "▁" (a space) before a text's first word; text the
        # grammar forces continues a text, so it is encoded after a newline that is then dropped
        # (a newline is a byte token of its own: it merges with nothing)
        self._lead = tokenizer.encode("\n", allow_special=False)
        self._prepends = self.tokens[tokenizer.encode("a", allow_special=False)[0]].startswith(b" ")

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if not self._prepends:
            return self._tokenizer.encode(text, allow_special=False)
        ids = self._tokenizer.encode("\n" + text, allow_special=False)
        return ids[len(self._lead):] if ids[: len(self._lead)] == self._lead else ids


def _bytes_of(tokenizer: Tokenizer, token_id: int) -> bytes:
    try:
        return tokenizer.decode_bytes([token_id])
    except ValueError:  # a hole in the vocabulary: a token no text can produce
        return b""


def grammar_vocabulary(tokenizer: Tokenizer, vocab_size: int, stop_ids: Sequence[int]):
    """llguidance's view of a tokenizer (built once per tokenizer, vocabulary size and stop ids)."""
    llg = _llguidance()
    key = (vocab_size, tuple(stop_ids))
    built = _VOCABULARIES.setdefault(tokenizer, {})
    if key not in built:
        wrapped = _Wrapped(tokenizer, vocab_size, stop_ids)
        built[key] = llg.LLTokenizer(llg.TokenizerWrapper(wrapped), n_vocab=vocab_size, eos_token=list(stop_ids))
    return built[key]


class Constraint:
    """The "grammar" stage: logits of tokens the grammar does not allow next become -inf. It is
    told each chosen token (`accept`) and advances its matcher."""

    name = "grammar"

    def __init__(self, matcher, vocab_size: int, description: str):
        self.matcher, self.vocab_size, self.description = matcher, vocab_size, description
        self.bitmask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)

    @classmethod
    def json_schema(cls, tokenizer: Tokenizer, vocab_size: int, schema: dict, stop_ids: Sequence[int],
                    param: str = "response_format") -> Constraint:
        """Text that parses as JSON and validates against `schema`. A schema the engine cannot
        compile raises InvalidParameter naming `param`."""
        if not isinstance(schema, dict):
            raise InvalidParameter(param, f"a JSON schema must be an object, got {type(schema).__name__}")
        if not stop_ids:
            raise InvalidParameter(param, "constrained decoding needs a stop token (the model has none)")
        check_schema_depth(schema, param, "the JSON schema", ENGINE_SCHEMA_DEPTH)
        llg = _llguidance()
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_LAYOUT)
        except (ValueError, TypeError) as e:
            raise InvalidParameter(param, f"the JSON schema cannot be compiled: {_first_line(e)}") from None
        matcher = llg.LLMatcher(grammar_vocabulary(tokenizer, vocab_size, stop_ids), grammar)
        if matcher.is_error():
            raise InvalidParameter(param, f"the JSON schema cannot be compiled: {_first_line(matcher.get_error())}")
        return cls(matcher, vocab_size, "json_schema")

    @classmethod
    def json_object(cls, tokenizer: Tokenizer, vocab_size: int, stop_ids: Sequence[int],
                    param: str = "response_format") -> Constraint:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        constraint = cls.json_schema(tokenizer, vocab_size, {"type": "object"}, stop_ids, param)
        constraint.description = "json_object"
        return constraint

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (vocab,) with every token the grammar does not allow next set to -inf."""
        if self.matcher.is_error():
            raise ValueError(f"the grammar rejected the text so far: {_first_line(self.matcher.get_error())}")
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)
        allowed = ((self.bitmask[:, None] >> _SHIFTS) & 1).view(-1)[: logits.shape[-1]].bool()  # (vocab,)
        return logits.masked_fill(~allowed.to(logits.device), NEG_INF)

    def accept(self, token_id: int) -> None:
        """Advance the grammar by the chosen token (a stop token ends it)."""
        if not self.matcher.consume_token(token_id):
            raise ValueError(f"token {token_id} is not allowed by the grammar: "
                             f"{_first_line(self.matcher.get_error())}")

    def reset(self) -> None:
        """Back to the grammar's start."""
        self.matcher.reset()

    def clone(self, uniforms=None) -> Constraint:
        """An independent copy at the same point of the grammar."""
        return Constraint(self.matcher.deep_copy(), self.vocab_size, self.description)


def json_depth(value, limit: int | None = None) -> int:
    """How deep objects and arrays nest in a JSON value, counted without recursion (so any depth
    Python could build is measured), stopping once past `limit`:
    json_depth({"a": [1, {}]}) == 3; json_depth("x") == 0."""
    deepest, todo = 0, [(value, 1)]
    while todo and (limit is None or deepest <= limit):
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in children)
    return deepest


def check_schema_depth(schema, param: str, what: str, limit: int = MAX_SCHEMA_DEPTH) -> None:
    """InvalidParameter naming `param` and `what` if `schema` nests deeper than `limit`."""
    if json_depth(schema, limit) > limit:
        raise InvalidParameter(param, f"{what} is nested more than {limit} levels deep (objects and arrays); "
                               f"the limit is {limit}")


def _first_line(error) -> str:
    return str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
