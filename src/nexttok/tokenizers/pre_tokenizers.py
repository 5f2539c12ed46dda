"""Pre-tokenizers: each turns a list of strings into a finer list of strings, with HF semantics.

BPE merges never cross the boundaries they draw: " Paris." -> [" Paris", "."] under GPT-2's regex.
tokenizer_json builds them from a tokenizer.json's "pre_tokenizer" spec; the Tokenizer runs them,
once per stretch of text between added tokens. at_start says whether the first string begins the
whole input (HF: its original offset is 0), which Metaspace's prepend_scheme "first" depends on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import regex

# GPT-2's pre-tokenizer pattern; also what a ByteLevel pre-tokenizer with use_regex uses.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# HF SplitDelimiterBehavior: what happens to the pieces a Split pattern matches
SPLIT_BEHAVIORS = ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")

PreTokenizer = Callable[..., list[str]]  # (words: list[str], at_start: bool = True) -> words
METASPACE = "\u2581"  # "▁", SentencePiece's visible space
PREPEND_SCHEMES = ("always", "first", "never")


def _split_isolated(pattern: regex.Pattern, text: str) -> list[str]:
    """Matches and the gaps between them, in order: ("a1", \\d) -> ["a", "1"]."""
    words = pattern.findall(text)
    if sum(map(len, words)) == len(text):  # the usual case: the pattern covers all text
        return words
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out.append(text[pos : m.start()])
        if m.end() > m.start():
            out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def _split_spans(pattern: regex.Pattern, text: str, invert: bool) -> list[tuple[str, bool]]:
    """(piece, is_match) over the whole text; invert swaps which side counts as the match."""
    spans, pos = [], 0
    for m in pattern.finditer(text):
        if m.end() == m.start():
            continue
        if m.start() > pos:
            spans.append((text[pos : m.start()], invert))
        spans.append((m.group(), not invert))
        pos = m.end()
    if pos < len(text):
        spans.append((text[pos:], invert))
    return spans


def _apply_behavior(spans: list[tuple[str, bool]], behavior: str) -> list[str]:
    """HF SplitDelimiterBehavior over (piece, is_delimiter) spans.

    (["a", ",", ",", "b"], MergedWithPrevious) -> ["a,", ",", "b"]: a delimiter joins its
    neighbour only when that neighbour is not itself a delimiter, as in HF.
    """
    if behavior == "Isolated":
        return [s for s, _ in spans]
    if behavior == "Removed":
        return [s for s, delim in spans if not delim]
    if behavior == "MergedWithNext":  # the mirror image of MergedWithPrevious
        return [s[::-1] for s in _apply_behavior([(s[::-1], d) for s, d in reversed(spans)],
                                                 "MergedWithPrevious")][::-1]
    out: list[str] = []
    prev_delim = False
    for s, delim in spans:
        joins = (delim and not prev_delim) if behavior == "MergedWithPrevious" else delim == prev_delim
        if joins and out:
            out[-1] += s
        else:
            out.append(s)
        prev_delim = delim
    return out


def regex_split(pattern: str, behavior: str = "Isolated", invert: bool = False) -> PreTokenizer:
    """HF's Split: regex_split(r"\\p{N}")(["a12"]) -> ["a", "1", "2"]."""
    if behavior not in SPLIT_BEHAVIORS:
        raise ValueError(f"Split behavior {behavior!r} is not one of {', '.join(SPLIT_BEHAVIORS)}")
    compiled = regex.compile(pattern)
    if behavior == "Isolated" and not invert:
        def split(words: list[str], at_start: bool = True) -> list[str]:
            if len(words) == 1:
                return _split_isolated(compiled, words[0])
            return [w for word in words for w in _split_isolated(compiled, word)]
        return split

    def split_general(words: list[str], at_start: bool = True) -> list[str]:
        out = []
        for word in words:
            out += _apply_behavior(_split_spans(compiled, word, invert), behavior)
        return out
    return split_general


def byte_level(add_prefix_space: bool = False, use_regex: bool = True) -> PreTokenizer:
    """HF's ByteLevel (the bytes-to-chars step is the Tokenizer's): byte_level()(["a b"]) -> ["a", " b"]."""
    splitter = regex_split(GPT2_PATTERN) if use_regex else None

    def pre(words: list[str], at_start: bool = True) -> list[str]:
        if add_prefix_space:
            words = [w if w.startswith(" ") else " " + w for w in words]
        return splitter(words) if splitter else words
    return pre


def digits(individual: bool) -> PreTokenizer:
    """HF's Digits: digits(True)(["a12"]) -> ["a", "1", "2"]; digits(False) keeps "12" whole."""
    return regex_split(r"\p{N}" if individual else r"\p{N}+")


def chain(stages: Sequence[PreTokenizer]) -> PreTokenizer:
    """HF's Sequence: each stage splits what the one before produced."""
    if len(stages) == 1:
        return stages[0]

    def chained(words: list[str], at_start: bool = True) -> list[str]:
        for stage in stages:
            words = stage(words, at_start)
        return words
    return chained


def metaspace(replacement: str = METASPACE, prepend_scheme: str = "always", split: bool = True) -> PreTokenizer:
    """HF's Metaspace: spaces become `replacement`, which is prepended to a word that lacks it
    ("always"; "first": only to the word that begins the input; "never"), and with split each
    replacement starts a new word: metaspace()(["Hello world"]) -> ["▁Hello", "▁world"]."""
    if prepend_scheme not in PREPEND_SCHEMES:
        raise ValueError(f"Metaspace prepend_scheme {prepend_scheme!r} is not one of {', '.join(PREPEND_SCHEMES)}")
    splitter = regex_split(regex.escape(replacement), "MergedWithNext") if split else None

    def pre(words: list[str], at_start: bool = True) -> list[str]:
        out = []
        for i, word in enumerate(words):
            word = word.replace(" ", replacement)
            prepend = prepend_scheme == "always" or (prepend_scheme == "first" and i == 0 and at_start)
            out.append(replacement + word if prepend and not word.startswith(replacement) else word)
        return splitter(out) if splitter else out
    return pre
