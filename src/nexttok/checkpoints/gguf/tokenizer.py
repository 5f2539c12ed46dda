"""A GGUF file's tokenizer metadata as HF's tokenizer.json (+ tokenizer_config.json).

llama.cpp stores the vocabulary as tokenizer.ggml.* keys; the tokenizer.ggml.model key says which
kind it is:

- "gpt2": byte-level BPE with its merges; tokenizer.ggml.pre names the pre-tokenizer regex.
- "llama": SentencePiece BPE (Llama 2, Mistral, TinyLlama, Phi-3, Gemma): tokens with scores
  and types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte <0xNN>), no merges.
  SentencePiece merges the adjacent pair whose joined piece scores highest; as a merge list that
  is every split of every token into two tokens, best score first (merges_from_scores, the order
  transformers' GGUF loader uses), run with byte fallback. Spaces become "▁" and, when
  tokenizer.ggml.add_space_prefix (default true), one "▁" goes before each stretch of text, as
  llama.cpp and Llama 2's tokenizer.json (Prepend normalizer) do.
- "gemma4": BPE with the file's merges over SentencePiece-looking tokens (llama-vocab.cpp,
  LLAMA_VOCAB_PRE_TYPE_GEMMA4): every space becomes "▁" (escape_whitespaces; no prefix space), the
  text is split into lines and runs of newlines only, the merges run on the raw characters (not
  GPT-2's byte alphabet), a run of newlines that is a token is that token unmerged, and a character
  that no token holds becomes its bytes' <0xNN> tokens. BOS is always added (llama.cpp's PR 21500).

    tokenizer, config = hf_tokenizer(meta)   # meta: read_metadata(path)[0]
    tokenizer["model"]["byte_fallback"] is True for a "llama" vocabulary
"""

from __future__ import annotations

from nexttok.checkpoints.gguf.metadata import GGUFError
from nexttok.tokenizers.tokenizer import GEMMA4_END_TOKENS

# Llama 3's, Qwen2's and Qwen3.5's Split patterns (as their tokenizer.json files write them; Qwen3.5's keeps
# combining marks, \p{M}, with the letters before them)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_BYTE_LEVEL_NO_REGEX = {**_BYTE_LEVEL, "use_regex": False}


def _split(pattern: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        _BYTE_LEVEL_NO_REGEX]}


_DIGITS_THEN_BYTE_LEVEL = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]}

# llama.cpp's tokenizer.ggml.pre names → (pre_tokenizer, normalizer) as HF's tokenizer.json has them
PRE_TOKENIZERS: dict[str, tuple[dict, dict | None]] = {
    **{name: (_BYTE_LEVEL, None) for name in ("default", "gpt2", "gpt-2")},
    **{name: (_DIGITS_THEN_BYTE_LEVEL, None) for name in ("smollm", "starcoder", "refact", "codeshell")},
    **{name: (_split(LLAMA3_PATTERN), None)
       for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx")},
    **{name: (_split(QWEN2_PATTERN), {"type": "NFC"}) for name in ("qwen2", "deepseek-r1-qwen")},
    "qwen35": (_split(QWEN35_PATTERN), {"type": "NFC"}),
}

SPACE = "\u2581"  # "▁"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp token types


def hf_tokenizer(meta: dict) -> tuple[dict, dict]:
    """(tokenizer.json, tokenizer_config.json) for a GGUF's tokenizer metadata."""
    model = meta.get("tokenizer.ggml.model")
    tokens = vocabulary(meta)
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFError(f"GGUF has {len(types)} token types for {len(tokens)} tokens")
    if model == "gpt2":
        tokenizer = _byte_level_json(meta, tokens, types)
    elif model == "llama":
        tokenizer = _sentencepiece_json(meta, tokens, types)
    elif model == "gemma4":
        tokenizer = _gemma4_json(meta, tokens, types)
    else:
        raise GGUFError(f"GGUF tokenizer model {model!r} is not supported "
                        "('gpt2': byte-level BPE, 'llama': SentencePiece BPE, 'gemma4': BPE over '▁' text)")
    tokenizer["post_processor"] = _template(meta, tokens)
    return tokenizer, _tokenizer_config(meta, tokens)


def _byte_level_json(meta: dict, tokens: list[str], types: list[int]) -> dict:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise GGUFError(f"GGUF pre-tokenizer {pre!r} is not known (known: {known})")
    pre_tokenizer, normalizer = PRE_TOKENIZERS[pre]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _added(tokens, types, special=(CONTROL,), plain=(USER_DEFINED,)),
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": _bpe_model(tokens, list(meta.get("tokenizer.ggml.merges") or []), byte_fallback=False,
                            ignore_merges=pre.startswith("llama"), unk=None),
    }


def _sentencepiece_json(meta: dict, tokens: list[str], types: list[int]) -> dict:
    gemma = str(meta.get("general.architecture", "")).startswith("gemma")
    if gemma:  # Gemma files store a token of spaces as real spaces; the text has "▁" there
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        scores = meta.get("tokenizer.ggml.scores")
        if gemma:  # Gemma's scores do not follow its merge order; its token order does
            scores = [-float(i) for i in range(len(tokens))]
        if not isinstance(scores, list) or len(scores) != len(tokens):
            raise GGUFError("GGUF SentencePiece vocabulary needs tokenizer.ggml.scores, one per token")
        merges = merges_from_scores(tokens, scores)
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    space = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    unk = _special_id(meta, "unknown", tokens)
    decoder = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
               {"type": "ByteFallback"}, {"type": "Fuse"}]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _added(tokens, types, special=(UNKNOWN, CONTROL), plain=(USER_DEFINED,),
                               rstrip=_rstrip_tokens(meta, tokens, types)),
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, space]}
        if prefix else space,
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoder + (
            [{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])},
        "model": _bpe_model(tokens, [f"{a} {b}" for a, b in merges], byte_fallback=True,
                            ignore_merges=False, unk=tokens[unk] if unk is not None else None),
    }


def _gemma4_json(meta: dict, tokens: list[str], types: list[int]) -> dict:
    """llama.cpp's "gemma4" vocabulary (llama-vocab.cpp: the merges read at load, the GEMMA4
    pre-tokenizer, escape_whitespaces, the newline-run lookup in llm_tokenizer_bpe_session)."""
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise GGUFError("GGUF gemma4 vocabulary needs tokenizer.ggml.merges")
    # llama.cpp makes its end-of-generation tokens control tokens (<|tool_response> is user-defined in the
    # file): never matched in text read without special tokens, nothing when decoded without them
    types = [CONTROL if t in GEMMA4_END_TOKENS else kind for t, kind in zip(tokens, types, strict=True)]
    space = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    # a token's text as llama.cpp's token_to_piece gives it ("▁" a space, <0xNN> a byte), the pieces joined:
    # what its server sends (its llama_detokenize also drops a space before ?!., and in some contractions)
    decoder = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
               {"type": "ByteFallback"}, {"type": "Fuse"}]
    # unk None: a byte that has no <0xNN> token is dropped, as llama.cpp does, not made <unk>
    model = _bpe_model(tokens, split_merges(merges), byte_fallback=True, ignore_merges=False, unk=None)
    model["whole_words"] = r"\n+"  # nexttok's own key (Tokenizer's whole_words)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _added(tokens, types, special=(UNKNOWN, CONTROL), plain=(USER_DEFINED,)),
        "normalizer": space,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"[^\n]+|[\n]+"}, "behavior": "Isolated",
                          "invert": False},
        "decoder": {"type": "Sequence", "decoders": decoder},
        "model": model,
    }


def split_merges(merges: list[str]) -> list[list[str]]:
    """llama.cpp's reading of a merge: split at the first space after its first character, so that a
    token may begin with a space: split_merges(["a b", "  x"]) -> [["a", "b"], [" ", "x"]]. One with no
    such space, or nothing after it, llama.cpp files under a pair with an empty side that nothing
    matches: left out here."""
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        if 0 < cut < len(merge) - 1:
            pairs.append([merge[:cut], merge[cut + 1:]])
    return pairs


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best score first; among equal scores the longer
    left part, then the longer right part, then the token and part ids in order (transformers'
    generate_merges): merges_from_scores(["a", "b", "ab"], [0, 0, 5]) -> [("a", "b")]."""
    vocab = {t: i for i, t in enumerate(tokens)}
    first: dict[str, float] = {}
    for token, score in zip(tokens, scores, strict=True):
        first.setdefault(token, score)  # a repeated token: its first place, its last score
        first[token] = score
    found = []
    for token, score in first.items():
        local = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        found += [(left, right, score) for left, right in local]
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)  # stable: ties keep order
    return [(left, right) for left, right, _ in found]


def _bpe_model(tokens: list[str], merges: list, *, byte_fallback: bool, ignore_merges: bool,
               unk: str | None) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
            "ignore_merges": ignore_merges, "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges}


def _added(tokens: list[str], types: list[int], *, special: tuple[int, ...], plain: tuple[int, ...],
           rstrip: frozenset[int] = frozenset()) -> list[dict]:
    """Tokens matched whole in the text before BPE: control (and unknown) ones as special,
    user-defined ones (e.g. <think>) as plain added tokens, as transformers' GGUF loader adds them."""
    return [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": i in rstrip,
             "normalized": False, "special": kind in special}
            for i, (t, kind) in enumerate(zip(tokens, types, strict=True)) if t and kind in special + plain]


def _rstrip_tokens(meta: dict, tokens: list[str], types: list[int]) -> frozenset[int]:
    """Phi-3's special tokens swallow the whitespace after them (its tokenizer.json says rstrip;
    llama.cpp sets it by model name): all but <unk>, <s> and <|endoftext|>."""
    name = str(meta.get("general.name", "")).lower()
    if "phi-3" not in name and "phi3" not in name:
        return frozenset()
    return frozenset(i for i, (t, kind) in enumerate(zip(tokens, types, strict=True))
                     if (kind in (UNKNOWN, CONTROL, USER_DEFINED) or t == "</s>")
                     and t not in ("<unk>", "<s>", "<|endoftext|>"))


def vocabulary(meta: dict) -> list[str]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise GGUFError("GGUF metadata tokenizer.ggml.tokens (the vocabulary) is missing or unreadable")
    return tokens


def _special_id(meta: dict, name: str, tokens: list[str]) -> int | None:
    token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
    if token_id is not None and not (type(token_id) is int and 0 <= token_id < len(tokens)):
        raise GGUFError(f"GGUF {name} token id {token_id!r} is outside the {len(tokens)}-token vocabulary")
    return token_id


def _tokenizer_config(meta: dict, tokens: list[str]) -> dict:
    """tokenizer_config.json: the special tokens by name, and the chat template when there is one."""
    config = {}
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = _special_id(meta, key, tokens)
        if token_id is not None:
            config[f"{name}_token"] = tokens[token_id]
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(meta.get("tokenizer.chat_template"), str):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


def _template(meta: dict, tokens: list[str]) -> dict | None:
    """The post-processor adding BOS (and EOS) as tokenizer.ggml.add_bos_token (add_eos_token)
    say; a SentencePiece vocabulary adds BOS unless it says otherwise, and a gemma4 one whatever it
    says, as llama.cpp does."""
    model = meta.get("tokenizer.ggml.model")
    add_bos = model == "gemma4" or meta.get("tokenizer.ggml.add_bos_token", model == "llama")
    bos = _special_id(meta, "bos", tokens) if add_bos else None
    eos = _special_id(meta, "eos", tokens) if meta.get("tokenizer.ggml.add_eos_token", False) else None
    if bos is None and eos is None:
        return None

    def wrapped(sequence: str, type_id: int) -> list[dict]:
        special = [{"SpecialToken": {"id": tokens[i], "type_id": type_id}} if i is not None else None
                   for i in (bos, eos)]
        body = {"Sequence": {"id": sequence, "type_id": type_id}}
        return [s for s in (special[0], body, special[1]) if s is not None]

    return {"type": "TemplateProcessing", "single": wrapped("A", 0), "pair": wrapped("A", 0) + wrapped("B", 1),
            "special_tokens": {tokens[i]: {"id": tokens[i], "ids": [i], "tokens": [tokens[i]]}
                               for i in (bos, eos) if i is not None}}
