"""Normalizers: text → text before pre-tokenization, with HF `tokenizers` semantics.

The Tokenizer runs its normalizer once per stretch of text between added tokens, as HF does, so a
SentencePiece-style Prepend("▁") marks the start of every stretch:
"Hi<s>there" -> "▁Hi", <s>, "▁there" (Llama 2, Phi-3, TinyLlama tokenizer.json files).

    normalizer_from_json({"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})("Hello world")
    == "▁Hello▁world"
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

import regex

from nexttok.tokenizers.tokenizer import TokenizerError

Normalizer = Callable[[str], str]

_SUPPORTED = "NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence"


def normalizer_from_json(spec: dict | None) -> Normalizer | None:
    """The normalizer a tokenizer.json's "normalizer" spec describes (None for none)."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise TokenizerError(f"normalizer must be an object or null, got {spec!r}")
    kind = spec.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda text: unicodedata.normalize(kind, text)
    if kind == "Lowercase":  # char by char, as HF: no context rule such as Greek final sigma
        return lambda text: "".join(map(str.lower, text))
    if kind == "Prepend":
        return prepend(_string(spec, "prepend"))
    if kind == "Replace":
        return replace(spec_pattern(spec, "Replace normalizer"), _string(spec, "content"))
    if kind == "Strip":
        return strip(bool(spec.get("strip_left", True)), bool(spec.get("strip_right", True)))
    if kind == "Sequence":
        return sequence([n for n in map(normalizer_from_json, spec.get("normalizers") or []) if n])
    raise TokenizerError(f"normalizer type {kind!r} is not supported (supported: {_SUPPORTED})")


def prepend(prefix: str) -> Normalizer:
    """HF's Prepend: prepend("▁")("Hi") == "▁Hi"; empty text stays empty."""
    return lambda text: prefix + text if text else text


def replace(pattern: regex.Pattern, content: str) -> Normalizer:
    """HF's Replace, every non-overlapping match: replace(regex.compile(" "), "▁")("a b") == "a▁b"."""
    return lambda text: pattern.sub(lambda _: content, text)


def strip(left: bool, right: bool) -> Normalizer:
    """HF's Strip (Unicode whitespace): strip(True, False)("  a ") == "a "."""
    def normalize(text: str) -> str:
        if left:
            text = text.lstrip()
        return text.rstrip() if right else text
    return normalize


def sequence(parts: list[Normalizer]) -> Normalizer:
    """HF's Sequence: each normalizer runs on what the one before produced."""
    if len(parts) == 1:
        return parts[0]

    def normalize(text: str) -> str:
        for part in parts:
            text = part(text)
        return text
    return normalize


def _string(spec: dict, key: str) -> str:
    value = spec.get(key)
    if not isinstance(value, str):
        raise TokenizerError(f"{spec.get('type')} normalizer needs a string {key!r}, got {value!r}")
    return value


def spec_pattern(spec: dict, what: str) -> regex.Pattern:
    """A tokenizer.json pattern, {"String": s} (literal) or {"Regex": r}, compiled."""
    pattern = spec.get("pattern")
    if isinstance(pattern, dict) and isinstance(pattern.get("String"), str):
        return regex.compile(regex.escape(pattern["String"]))
    if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
        try:
            return regex.compile(pattern["Regex"])
        except regex.error as e:
            raise TokenizerError(f"{what} pattern {pattern['Regex']!r} does not compile: {e}") from None
    raise TokenizerError(f"{what} needs a pattern {{'String': ...}} or {{'Regex': ...}}, got {pattern!r}")
