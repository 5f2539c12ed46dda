"""A tokenizer.json "decoder" as the Decoder the Tokenizer runs: the bytes each token stands for,
and what is stripped at the start of a whole sequence.

HF's decoders transform the list of token strings in a chain. The ones BPE tokenizers use are
per-token transformations (ByteLevel, Replace, ByteFallback, Metaspace, Strip before a Fuse), plus,
after Fuse has joined the tokens into one string, a Strip of the sequence's first characters —
so nexttok gives each id fixed bytes, which is what streaming needs, and strips at the start:

    Llama 2 / Mistral / Phi-3:  Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)
        "▁Hello" -> b" Hello", "<0xE6>" -> b"\\xe6"; decode strips the first leading space
    Gemma:                      Replace("▁", " "), ByteFallback, Fuse   (nothing stripped)
    Metaspace decoder:          "▁" is a space, except in a sequence's first token, where HF drops it

Where HF differs: a run of <0xNN> tokens that is not valid UTF-8 becomes one U+FFFD per token in HF,
U+FFFD per invalid sequence here (Python's "replace", as the byte-level path always did).
"""

from __future__ import annotations

from collections.abc import Callable

import regex

from nexttok.tokenizers.normalizers import spec_pattern
from nexttok.tokenizers.pre_tokenizers import METASPACE
from nexttok.tokenizers.tokenizer import BYTE_LEVEL_DECODER, Decoder, TokenizerError

_BYTE_TOKEN = regex.compile(r"<0x([0-9A-Fa-f]{2})>")
_SUPPORTED = "ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence"

Step = Callable[[str], "str | bytes"]


def decoder_from_json(spec: dict | None, byte_level: bool) -> Decoder:
    """The Decoder for a tokenizer.json decoder spec; byte_level: the tokenizer's pre-tokenizer
    maps bytes to GPT-2's printable characters (then only a ByteLevel decoder, or none, fits)."""
    if byte_level:
        if spec is not None and spec.get("type") != "ByteLevel":
            raise TokenizerError(f"decoder {spec.get('type')!r} does not fit a byte-level BPE tokenizer "
                                 "(a ByteLevel pre-tokenizer needs a ByteLevel decoder)")
        return BYTE_LEVEL_DECODER
    if spec is None:
        raise TokenizerError("decoder is null: a tokenizer without a ByteLevel pre-tokenizer needs one "
                             "(e.g. Replace('▁', ' '), ByteFallback, Fuse)")
    parts = (spec.get("decoders") or []) if spec.get("type") == "Sequence" else [spec]
    steps: list[Step] = []
    first: list[Step] | None = None  # the first token's own steps, where they differ (Metaspace)
    strip, fused = (" ", 0), False
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "Fuse":
            fused = True
        elif kind == "Strip" and fused:
            if part.get("stop", 0):
                raise TokenizerError("decoder Strip of a sequence's last characters is not supported")
            strip = _strip_content(part), int(part.get("start", 0))
        elif kind == "Metaspace":
            if fused:
                raise TokenizerError("a Metaspace decoder after Fuse is not supported")
            replacement = regex.compile(regex.escape(part.get("replacement", METASPACE)))
            scheme = part.get("prepend_scheme", "always" if part.get("add_prefix_space", True) else "never")
            # HF: in the first token of a sequence every replacement character is dropped
            first = [*(first or steps), _replace(replacement, "" if scheme != "never" else " ")]
            steps.append(_replace(replacement, " "))
        else:
            steps.append(_step(part))
            if first is not None:
                first.append(steps[-1])
    return Decoder(_token_bytes(steps), _token_bytes(first) if first else None, *strip)


def _step(part) -> Step:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "Replace":
        return _replace(spec_pattern(part, "Replace decoder"), part.get("content", ""))
    if kind == "ByteFallback":
        return _byte_fallback
    if kind == "Strip":  # before a Fuse, HF strips each token
        content, start, stop = _strip_content(part), int(part.get("start", 0)), int(part.get("stop", 0))
        return lambda token: _strip(token, content, start, stop)
    if kind == "ByteLevel":
        raise TokenizerError("a ByteLevel decoder needs a ByteLevel pre-tokenizer")
    raise TokenizerError(f"decoder type {kind!r} is not supported (supported: {_SUPPORTED})")


def _token_bytes(steps: list[Step]) -> Callable[[str], bytes]:
    """Run the per-token steps; once a step gives bytes (<0xNN>), the rest leave them alone."""
    def token_bytes(token: str) -> bytes:
        value: str | bytes = token
        for step in steps:
            if isinstance(value, bytes):
                break
            value = step(value)
        return value if isinstance(value, bytes) else value.encode()
    return token_bytes


def _replace(pattern: regex.Pattern, content: str) -> Step:
    return lambda token: pattern.sub(lambda _: content, token)


def _byte_fallback(token: str) -> str | bytes:
    """"<0xE6>" -> b"\\xe6"; any other token unchanged."""
    m = _BYTE_TOKEN.fullmatch(token) if len(token) == 6 else None
    return bytes([int(m.group(1), 16)]) if m else token


def _strip_content(part: dict) -> str:
    content = part.get("content", " ")
    if not (isinstance(content, str) and len(content) == 1):
        raise TokenizerError(f"decoder Strip content must be one character, got {content!r}")
    return content


def _strip(token: str, content: str, start: int, stop: int) -> str:
    """Up to `start` leading and `stop` trailing `content` characters removed: ("  a", " ", 1, 0) -> " a"."""
    i = 0
    while i < start and i < len(token) and token[i] == content:
        i += 1
    j = len(token)
    while len(token) - j < stop and j > i and token[j - 1] == content:
        j -= 1
    return token[i:j]
