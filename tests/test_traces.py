"""Traces: `run --trace` writes one, `replay` forces it through the model again, `diff` compares two.

The references: the trace's own schema (checked by jsonschema directly, not through the reader),
the model's distributions recomputed here by a forward pass, and files broken on purpose."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jsonschema
import pytest
import torch

from nexttok.checkpoints.identity import checkpoint_sha256
from nexttok.checkpoints.loading import load_checkpoint, load_model
from nexttok.cli import main
from nexttok.generation.diff import diff_traces
from nexttok.generation.loop import generate
from nexttok.generation.replay import replay
from nexttok.generation.trace import VERSION, VERSION_1_SAMPLING, TraceError, read_trace, schema
from nexttok.models.cache import KVCache

PROMPT = "The capital of France is"


def _run(model_dir: Path, path: Path, *flags: str) -> None:
    assert main(["run", str(model_dir), PROMPT, "--max-tokens", "24", "--trace", str(path), *flags]) == 0


@pytest.fixture(scope="module")
def greedy_trace(chat_model_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "greedy.jsonl"
    _run(chat_model_dir, path, "--temperature", "0")
    return path


def test_every_line_follows_the_shipped_schema(greedy_trace, chat_model_dir):
    lines = [json.loads(line) for line in greedy_trace.read_text(encoding="utf-8").splitlines()]
    validator = jsonschema.Draft202012Validator(schema())
    for line in lines:
        validator.validate(line)
    header, steps, end = lines[0], lines[1:-1], lines[-1]
    assert header["format"] == "nexttok-trace" and header["version"] == VERSION
    assert header["model"]["sha256"] == checkpoint_sha256(chat_model_dir)
    assert header["runtime"]["dtype"] == "float32" and header["prompt"]["text"] == PROMPT
    checkpoint = load_checkpoint(chat_model_dir)
    assert header["prompt"]["ids"] == checkpoint.tokenizer.encode(PROMPT, add_special=True)
    assert [s["index"] for s in steps] == list(range(24)) and end["completion_tokens"] == 24
    assert end["text"] == "".join(s["text"] for s in steps) and end["finish_reason"] == "length"
    assert all(s["draw"] is None and s["rank"] == 1 and s["top"][0]["id"] == s["id"] for s in steps)  # greedy


def test_the_recorded_logprobs_are_the_models(greedy_trace, chat_model_dir):
    """Each step's logprob and alternatives: log_softmax of one plain forward over the whole text."""
    trace = read_trace(greedy_trace)
    model = load_model(chat_model_dir)
    ids = trace.prompt_ids + trace.token_ids
    with torch.inference_mode():
        logprobs = model(torch.tensor([ids]))[0].float().log_softmax(-1)
    first = len(trace.prompt_ids) - 1
    for k, step in enumerate(trace.steps):
        row = logprobs[first + k]
        assert step["logprob"] == pytest.approx(float(row[step["id"]]), abs=1e-4)
        assert [a["id"] for a in step["top"]] == torch.topk(row, 5).indices.tolist()


def test_replay_on_the_same_build_is_exact(greedy_trace, chat_model_dir, capsys):
    trace = read_trace(greedy_trace)
    result = replay(load_model(chat_model_dir), trace)
    assert [s.logprob_now for s in result.steps] == [s["logprob"] for s in trace.steps]  # the same bits
    assert result.max_delta == 0 and not any(s.top_changed for s in result.steps) and all(s.kept for s in result.steps)
    assert main(["replay", str(greedy_trace)]) == 0
    assert "24 steps replayed; largest logprob change 0.00e+00; top-1 changed at 0" in capsys.readouterr().err
    one_pass = replay(load_model(chat_model_dir), trace, one_pass=True)  # a longer forward rounds otherwise
    assert one_pass.max_delta < 1e-4


V1_ORDER = ["penalties", "logit_bias", "top_k", "top_p", "min_p", "temperature"]


def test_a_version_1_trace_still_replays(chat_model_dir, tmp_path, capsys):
    """Reading is additive: a trace as version 1 wrote it (ten sampling fields, the six stages of
    then) reads with every later setting at its neutral default, replays exactly, and its settings
    generate its tokens again."""
    _run(chat_model_dir, tmp_path / "new.jsonl", "--temperature", "0.9", "--top-k", "20",
         "--repetition-penalty", "1.3", "--seed", "3")
    lines = (tmp_path / "new.jsonl").read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header["version"] = 1
    header["sampling"] = {**{k: header["sampling"][k] for k in VERSION_1_SAMPLING}, "order": V1_ORDER}
    path = tmp_path / "v1.jsonl"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    old, new = read_trace(path), read_trace(tmp_path / "new.jsonl")
    assert list(old.sampling_params().order) == V1_ORDER
    assert {k: v for k, v in vars(old.sampling_params()).items() if k != "order"} == \
        {k: v for k, v in vars(new.sampling_params()).items() if k != "order"}
    checkpoint = load_checkpoint(chat_model_dir)
    result = replay(checkpoint.model, old, tokenizer=checkpoint.tokenizer)
    assert result.max_delta == 0 and all(s.kept for s in result.steps)
    again = generate(checkpoint.model, checkpoint.tokenizer, old.prompt_ids, old.sampling_params(), max_tokens=24)
    assert again.token_ids == old.token_ids
    assert main(["replay", str(path)]) == 0
    assert "24 steps replayed; largest logprob change 0.00e+00" in capsys.readouterr().err


def _as_run_logprobs(model, trace) -> list[torch.Tensor]:
    """The test's own loop: the prompt, then the recorded tokens one at a time through a cache."""
    cache = KVCache.for_model(model.config, max_len=len(trace.prompt_ids) + len(trace.steps))
    rows = []
    with torch.inference_mode():
        logits = model(torch.tensor([trace.prompt_ids]), cache)[0, -1]
        for token in trace.token_ids:
            rows.append(logits.float().log_softmax(-1))
            logits = model(torch.tensor([[token]]), cache)[0, -1]
    return rows


def test_replay_in_int8_reports_the_steps_whose_top_1_changed(tmp_path, gpt2_dir):
    """Greedy in float32, replayed with int8 linear layers (bfloat16 activations): the report lists
    exactly the steps whose argmax changed (found here by the test's own loop), each with the margin
    of the new top-1 over the old. On these tiny models int8 swaps only exact ties of its bfloat16
    logits (margin 0), which no threshold counts as a change."""
    from tiny_models import write_tiny_with_gpt2_tokenizer

    for seed in range(8):  # random weights: the first model where int8 changes a top-1 (seed 2)
        model_dir = tmp_path / f"m{seed}"
        write_tiny_with_gpt2_tokenizer("llama_long_context", model_dir, gpt2_dir, seed=seed)
        path = tmp_path / f"t{seed}.jsonl"
        _run(model_dir, path, "--temperature", "0")
        trace = read_trace(path)
        int8 = load_model(model_dir, dtype="int8")
        rows = _as_run_logprobs(int8, trace)
        flipped = [k for k, row in enumerate(rows) if int(row.argmax()) != trace.steps[k]["top"][0]["id"]]
        if flipped:
            break
    else:
        pytest.fail("no seed gave a step whose top-1 int8 changes")
    margins = [float(rows[k].max() - rows[k][trace.steps[k]["top"][0]["id"]]) for k in flipped]
    result = replay(int8, trace)
    assert [s.index for s in result.steps if s.top_changed] == flipped
    assert [result.steps[k].margin for k in flipped] == pytest.approx(margins, abs=1e-6)
    assert [s.logprob_now for s in result.steps] == pytest.approx([float(r[t]) for r, t in zip(
        rows, trace.token_ids, strict=True)], abs=1e-6)
    assert main(["replay", str(path), "--dtype", "int8", "--threshold", str(max(margins))]) == 0


def test_a_top_1_that_changed_by_more_than_the_threshold_fails_the_replay(greedy_trace, tmp_path, capsys):
    """Built on purpose: the trace claims that at step 3 the model's top-1 was its second choice.
    Replayed, step 3's top-1 has changed, by the model's lead of its first choice over that one."""
    trace = read_trace(greedy_trace)
    record = trace.steps[3]
    claimed = record["top"][1]
    lines = greedy_trace.read_text(encoding="utf-8").splitlines()
    lines[4] = _set(lines[4], top=[claimed, *[a for a in record["top"] if a != claimed]])
    path = tmp_path / "claimed.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    lead = record["top"][0]["logprob"] - claimed["logprob"]
    assert main(["replay", str(path), "--threshold", str(lead / 2)]) == 1
    out = capsys.readouterr()
    assert "top-1 changed at 1 (margin over" in out.err and f"{lead:.3f}" in out.out
    assert main(["replay", str(path), "--threshold", str(lead * 2)]) == 0
    changed = replay(load_model(trace.header["model"]["path"]), read_trace(path)).steps[3]
    assert changed.top_changed and changed.margin == pytest.approx(lead, abs=1e-6)


def test_diff_the_lessons_experiment(chat_model_dir, tmp_path, capsys):
    """The same prompt twice at temperature 0 and twice at 1 (other seeds): the first pair is
    identical; the second parts at a step whose two candidates' probabilities are the model's."""
    paths = {}
    for name, flags in {"t0a": ["--temperature", "0"], "t0b": ["--temperature", "0"],
                        "t1a": ["--temperature", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "1"],
                        "t1b": ["--temperature", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "2"]
                        }.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        _run(chat_model_dir, paths[name], *flags)
    same = diff_traces(read_trace(paths["t0a"]), read_trace(paths["t0b"]))
    assert same.identical and same.settings == []
    a, b = read_trace(paths["t1a"]), read_trace(paths["t1b"])
    d = diff_traces(a, b)
    assert d.settings == [("sampling.seed", 1, 2)]
    k = d.divergence.index
    assert a.token_ids[:k] == b.token_ids[:k] and a.token_ids[k] != b.token_ids[k]
    model = load_model(chat_model_dir)
    with torch.inference_mode():
        probs = model(torch.tensor([a.prompt_ids + a.token_ids[:k]]))[0, -1].float().softmax(-1)
    gap = float(probs[a.token_ids[k]] - probs[b.token_ids[k]])
    assert d.divergence.gap == pytest.approx(gap, abs=1e-5)
    assert d.divergence.near_tie == (abs(math.log(probs[a.token_ids[k]] / probs[b.token_ids[k]])) < 0.1)
    capsys.readouterr()
    assert main(["diff", str(paths["t1a"]), str(paths["t1b"])]) == 0
    shown = capsys.readouterr().out
    assert f"the same {k} tokens, then they part at step {k}" in shown and f"{gap:+.4f}" in shown
    assert main(["diff", str(paths["t0a"]), str(paths["t0b"])]) == 0
    assert "identical: the same 24 tokens" in capsys.readouterr().out


def test_diff_of_two_live_settings(chat_model_dir, capsys):
    assert main(["diff", str(chat_model_dir), PROMPT, "--a", "--temperature 0", "--b", "--temperature 0",
                 "--max-tokens", "8"]) == 0
    assert "identical: the same 8 tokens" in capsys.readouterr().out
    assert main(["diff", str(chat_model_dir), PROMPT, "--a", "--temperature 0", "--b", "--frobnicate 1"]) == 2
    assert "--a/--b '--frobnicate 1': unrecognized arguments: --frobnicate" in capsys.readouterr().err


def _broken(greedy_trace: Path, tmp_path: Path, edit) -> Path:
    lines = greedy_trace.read_text(encoding="utf-8").splitlines()
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(edit(lines)) + "\n", encoding="utf-8")
    return path


def _set(line: str, **changes) -> str:
    return json.dumps({**json.loads(line), **changes})


@pytest.mark.parametrize("edit,message", [
    (lambda ls: ls[:-1], "truncated: no end line after 24 steps"),
    (lambda ls: ls[:5], "truncated: no end line after 4 steps"),
    (lambda ls: [ls[0], ls[1][:40], *ls[2:]], "line 2: not JSON"),
    (lambda ls: [_set(ls[0], version=3), *ls[1:]], "nexttok-trace version 3; this nexttok reads versions 1, 2"),
    (lambda ls: [_set(ls[0], format="other"), *ls[1:]], "line 1: format: 'nexttok-trace' was expected"),
    (lambda ls: [ls[0], ls[1].replace('"logprob": -', '"logprob": NaN, "x": -', 1), *ls[2:]],
     "line 2: NaN is not a number a trace may hold"),
    (lambda ls: [ls[0], _set(ls[1], logprob=0.5), *ls[2:]], "line 2: logprob: 0.5 is greater than the maximum of 0"),
    (lambda ls: [ls[0], _set(ls[1], index=3), *ls[2:]], "line 2: step index 3, expected 0"),
    (lambda ls: [*ls[:-2], ls[-1]], "the end line counts 24 tokens, the file has 23 steps"),
    (lambda ls: [ls[0], json.dumps({k: v for k, v in json.loads(ls[1]).items() if k != "rank"}), *ls[2:]],
     "line 2: the line: 'rank' is a required property"),
    (lambda ls: [ls[0], _set(ls[1], type="note"), *ls[2:]], "line 2: type 'note': a trace line is a header"),
    (lambda ls: ls[1:], "its first line is not a header"),
])
def test_a_broken_trace_is_one_line_naming_what_is_wrong(greedy_trace, tmp_path, capsys, edit, message):
    path = _broken(greedy_trace, tmp_path, edit)
    with pytest.raises(TraceError, match=None) as caught:
        read_trace(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_trace_of_another_model_is_refused(greedy_trace, tmp_path, gpt2_dir, capsys):
    from tiny_models import write_tiny_with_gpt2_tokenizer

    other = tmp_path / "other"
    write_tiny_with_gpt2_tokenizer("llama_long_context", other, gpt2_dir, seed=5)
    capsys.readouterr()  # transformers' progress bar while writing it
    assert main(["replay", str(greedy_trace), "--model", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"(sha256 {checkpoint_sha256(other)[:12]}…)" in err and len(err.splitlines()) == 1
    with pytest.raises(TraceError, match="was recorded on"):
        read_trace(greedy_trace).check_model(checkpoint_sha256(other), "other")


def test_the_digest_is_the_files_and_is_kept_until_the_file_changes(tmp_path):
    import hashlib

    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 50)
    assert checkpoint_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    f.write_bytes(b"GGUF changed")
    assert checkpoint_sha256(f) == hashlib.sha256(b"GGUF changed").hexdigest()


def test_chat_traces_each_reply_and_replays_it(chat_model_dir, tmp_path, capsys):
    """chat --trace FILE: one trace per reply, whose prompt is the templated conversation so far."""
    from rich.console import Console

    from nexttok.cli import build_parser
    from nexttok.cli.chat import ChatSession

    checkpoint = load_checkpoint(chat_model_dir)
    base = tmp_path / "chat.jsonl"
    args = build_parser().parse_args(["chat", str(chat_model_dir), "--trace", str(base), "--temperature", "0",
                                      "--max-tokens", "6"])
    chat = ChatSession(checkpoint, "tiny", args, Console(file=None, quiet=True))
    chat.handle("Hello?")
    chat.handle("And then?")
    first, second = read_trace(tmp_path / "chat-1.jsonl"), read_trace(tmp_path / "chat-2.jsonl")
    assert first.text == chat.chat.turns[1]["content"] and second.text == chat.chat.turns[3]["content"]
    rendered = checkpoint.tokenizer.decode(second.prompt_ids)
    assert "Hello?" in rendered and first.text in rendered and rendered.rstrip().endswith("assistant")
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "chat-2.jsonl")]) == 0
    assert "6 steps replayed; largest logprob change 0.00e+00" in capsys.readouterr().err


def test_the_server_returns_traces_only_when_asked(client, server, served, tmp_path):
    """Through the official client: extra_body {"nexttok": {"trace": true}} adds `trace` (a choice's
    trace lines, which replay exactly); without it the response has OpenAI's fields only."""
    import httpx

    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    plain = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert "trace" not in plain
    answer = client.chat.completions.create(**body, n=2, extra_body={"nexttok": {"trace": True}})
    trace = answer.model_extra["trace"]
    assert trace["format"] == "nexttok-trace" and [c["index"] for c in trace["choices"]] == [0, 1]
    lines = trace["choices"][0]["lines"]
    path = tmp_path / "served.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    read = read_trace(path)
    assert read.text == answer.choices[0].message.content and read.header["model"]["name"] == "tiny"
    assert read.header["model"]["sha256"] == checkpoint_sha256(served.path)
    assert read.prompt_ids == served.tokenizer.encode(served.chat_template.render(body["messages"]))
    assert main(["replay", str(path)]) == 0
    # the server decodes both choices as one batch (its slot cache, ragged attention): the same
    # tokens, logprobs to float32's last bits
    assert replay(served.model, read).max_delta < 1e-5


def test_a_streamed_trace_is_the_last_event(client):
    stream = client.completions.create(model="tiny", prompt="Once upon", max_tokens=6, temperature=0, stream=True,
                                       extra_body={"nexttok": {"trace": True}})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    last = chunks[-1].model_extra["trace"]["choices"][0]["lines"]
    assert chunks[-1].choices == [] and last[-1]["type"] == "end" and last[-1]["text"] == text
    assert len(last) == 8 and [line["type"] for line in last] == ["header", *["step"] * 6, "end"]


def test_a_trace_of_nothing_generated_is_refused(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="nexttok.trace: with max_tokens 0 nothing is generated"):
        client.completions.create(model="tiny", prompt="Once upon", max_tokens=0, echo=True, logprobs=1,
                                  extra_body={"nexttok": {"trace": True}})
    with pytest.raises(openai.BadRequestError, match="nexttok.trace: best_of drops choices"):
        client.completions.create(model="tiny", prompt="Once upon", max_tokens=4, best_of=2,
                                  extra_body={"nexttok": {"trace": True}})
    with pytest.raises(openai.BadRequestError, match="Invalid value for nexttok: Input should be a valid boolean"):
        client.completions.create(model="tiny", prompt="Once upon", max_tokens=4,
                                  extra_body={"nexttok": {"trace": "yes"}})


# --- files that are not traces at all (issue 36) -------------------------------------------------

def test_an_endless_line_is_refused_not_read_to_the_end(capsys):
    """/dev/zero is one line that never ends: it was read until the kernel killed the process."""
    assert main(["replay", "/dev/zero"]) == 2
    assert capsys.readouterr().err.strip() == ("error: trace /dev/zero: line 1 is longer than 16 MiB, more than "
                                               "a trace line holds (is it a trace?)")


def test_a_file_past_the_size_bound_is_refused(greedy_trace, monkeypatch):
    from nexttok.generation import trace

    read_trace(greedy_trace)
    monkeypatch.setattr(trace, "MAX_TRACE_BYTES", greedy_trace.stat().st_size - 1)
    with pytest.raises(TraceError, match=rf"^trace {re.escape(str(greedy_trace))}: larger than 0 GiB"):
        read_trace(greedy_trace)
    monkeypatch.setattr(trace, "MAX_LINE_BYTES", 100)
    with pytest.raises(TraceError, match=r": line 1 is longer than 0 MiB"):
        read_trace(greedy_trace)


def test_a_line_separator_in_a_tokens_text_stays_in_its_line(greedy_trace, tmp_path):
    """The writer leaves U+2028 unescaped (ensure_ascii=False): lines split at "\\n" only."""
    lines = greedy_trace.read_text(encoding="utf-8").split("\n")
    step = json.loads(lines[1])
    lines[1] = json.dumps({**step, "token_text": "a\u2028b\x85c"}, ensure_ascii=False)
    path = tmp_path / "separator.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    assert read_trace(path).steps[0]["token_text"] == "a\u2028b\x85c"
