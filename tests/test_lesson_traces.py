"""The Experiments section's traces and speculative decoding, through the lesson's routes.

References, each run in the test itself: the runs recomputed with `stream` and compared by
`diff_traces` (and by `nexttok diff` on the route's own lines), the token ids compared by hand, the
model's softmax from a plain forward pass at a prefix, plain greedy `generate`, the library's
`speculative_stream`, and `generate` with the session's seed for a session's path."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from nexttok.checkpoints.identity import checkpoint_sha256
from nexttok.cli import main
from nexttok.generation.diff import diff_traces
from nexttok.generation.loop import generate, prompt_ids_for, stream
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.speculative import NgramDrafter, Rounds, speculative_stream
from nexttok.generation.trace import parse_trace, recorded, trace_header

PROMPT = "The king and the queen ate an apple"
REPEATING = "one two three four one two three four one two"  # greedy drafts here are taken and refused


@pytest.fixture(scope="module")
def live(tiny_live):
    server, served = tiny_live
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=120)  # noqa: E731
    return post, served


def _texts(lines: list[dict]) -> list[str]:
    return [json.dumps(line, ensure_ascii=False) for line in lines]


def _recomputed(served, params: SamplingParams, max_tokens: int, name: str):
    """A run of the model recorded in the test, independently of the route."""
    ids = prompt_ids_for(served.model, served.tokenizer, PROMPT)
    steps = list(stream(served.model, served.tokenizer, ids, params, max_tokens=max_tokens, top_n=5))
    header = trace_header(served.model, name=served.name, path=served.path, sha256=checkpoint_sha256(served.path),
                          prompt_text=PROMPT, prompt_ids=ids, params=params, max_tokens=max_tokens, stop=[],
                          stop_token_ids=list(served.model.config.eos_token_id), top_n=5)
    return recorded(header, steps, 0.0, name)


def _softmax_at(served, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return served.model(torch.tensor([ids]))[0, -1].float().softmax(-1)


def test_repeat_records_each_run_as_a_trace_and_diffs_each_pair(live, tmp_path, capsys):
    post, served = live
    view = post("/explain/experiments/repeat", {"prompt": PROMPT, "max_tokens": 8, "seed": 4}).json()
    settings = [SamplingParams(temperature=0), SamplingParams(temperature=0),
                SamplingParams(temperature=1, seed=5), SamplingParams(temperature=1, seed=6)]
    mine = [_recomputed(served, params, 8, f"run {k + 1}") for k, params in enumerate(settings)]
    theirs = [parse_trace(_texts(run["trace"]), f"run {k + 1}") for k, run in enumerate(view["runs"])]
    for run, trace, reference in zip(view["runs"], theirs, mine, strict=True):
        assert trace.header["model"]["sha256"] == checkpoint_sha256(served.path)
        assert trace.prompt_ids == served.tokenizer.encode(PROMPT, add_special=True)
        assert trace.token_ids == reference.token_ids == [t["id"] for t in run["tokens"]]
        assert [s["logprob"] for s in trace.steps] == pytest.approx([s["logprob"] for s in reference.steps], abs=1e-6)
        assert trace.text == run["text"] == reference.text

    same = view["diffs"]["temperature_0"]
    assert same["identical"] and same["index"] is None and view["divergence"]["temperature_0"] is None
    assert diff_traces(mine[0], mine[1]).identical and same["settings"] == []

    parted, reference = view["diffs"]["temperature_1"], diff_traces(mine[2], mine[3])
    a, b = mine[2].token_ids, mine[3].token_ids
    k = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)  # by hand
    assert parted["index"] == reference.divergence.index == k == view["divergence"]["temperature_1"]
    probs = _softmax_at(served, mine[2].prompt_ids + a[:k])  # the model's one distribution there
    assert [r["at"]["id"] for r in parted["runs"]] == [a[k], b[k]]
    assert [r["at"]["p"] for r in parted["runs"]] == pytest.approx([float(probs[a[k]]), float(probs[b[k]])], abs=1e-5)
    assert parted["gap"] == pytest.approx(float(probs[a[k]] - probs[b[k]]), abs=1e-5)
    assert parted["gap"] == pytest.approx(reference.divergence.gap, abs=1e-9)
    assert parted["near_tie"] == (abs(math.log(probs[a[k]] / probs[b[k]])) < parted["near_tie_nats"])
    assert [r["after"] for r in parted["runs"]] == [reference.divergence.text_a, reference.divergence.text_b]
    assert parted["settings"] == [{"what": "sampling.seed", "a": 5, "b": 6}]

    files = []  # the CLI's diff of the route's own lines says the same
    for run in view["runs"][2:]:
        files.append(tmp_path / f"run-{len(files)}.jsonl")
        files[-1].write_text("\n".join(_texts(run["trace"])) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["diff", *map(str, files)]) == 0
    shown = capsys.readouterr().out
    assert f"then they part at step {k}" in shown and f"{parted['gap']:+.4f}" in shown


def test_two_uploaded_traces_are_diffed_and_broken_ones_refused_in_one_line(live):
    post, served = live
    runs = post("/explain/experiments/repeat", {"prompt": PROMPT, "max_tokens": 6, "seed": 9}).json()["runs"]
    a, b = _texts(runs[0]["trace"]), _texts(runs[2]["trace"])
    view = post("/explain/traces/diff", {"a": a, "b": b, "name_a": "greedy.jsonl"}).json()
    reference = diff_traces(parse_trace(a, "A"), parse_trace(b, "B"))
    assert view["index"] == reference.divergence.index and view["gap"] == pytest.approx(reference.divergence.gap)
    assert [r["name"] for r in view["runs"]] == ["greedy.jsonl", "trace B"]
    assert [r["tokens"] for r in view["runs"]] == [runs[0]["tokens"], runs[2]["tokens"]]
    assert {"what": "sampling.temperature", "a": 0.0, "b": 1.0} in view["settings"]
    assert post("/explain/traces/diff", {"a": a, "b": a}).json()["identical"]

    nan = json.loads(b[1])
    nan["logprob"] = math.nan
    refusals = [({"a": a[:-1], "b": b, "name_a": "cut.jsonl"}, "a", "cut.jsonl: truncated: no end line after 6 steps"),
                ({"a": a, "b": [b[0], json.dumps(nan), *b[2:]]}, "b", "trace B line 2: NaN is not a number"),
                ({"a": a, "b": [b[0], b[1][:30], *b[2:]]}, "b", "trace B line 2: not JSON"),
                ({"a": [], "b": b}, "a", "at least 1 item"),
                ({"a": a, "b": b, "name_a": "two\nlines"}, "name_a", "name_a"),
                ({"a": a, "b": b, "c": a}, "c", "Unrecognized request argument supplied: c")]
    for body, param, message in refusals:
        bad = post("/explain/traces/diff", body)
        error = bad.json()["error"]
        assert bad.status_code == 400 and error["param"] == param and message in error["message"], bad.text
        assert "\n" not in error["message"]


def test_the_sessions_path_is_a_trace_of_one_run(live):
    post, served = live
    key = post("/explain/sessions", {"prompt": PROMPT, "seed": 3}).json()["session"]
    refused = post(f"/explain/sessions/{key}/trace", {})
    assert refused.status_code == 400 and "step first" in refused.json()["error"]["message"]
    dials = {"temperature": 0.7, "top_k": 0}
    steps = [post(f"/explain/sessions/{key}/step", dials).json() for _ in range(5)]
    got = post(f"/explain/sessions/{key}/trace", {}).json()
    trace = parse_trace(_texts(got["lines"]), "the session")
    path = [t["id"] for t in steps[-1]["generated"]]
    assert trace.token_ids == path and got["node"] == steps[-1]["child"]
    assert [s["logprob"] for s in trace.steps] == pytest.approx([v["step"]["logprob"] for v in steps], abs=1e-9)
    assert trace.text == steps[-1]["text"] and trace.end["finish_reason"] == "length"
    header = trace.header
    assert header["sampling"]["temperature"] == 0.7 and header["sampling"]["seed"] == 3
    assert header["limits"]["max_tokens"] == 5 and header["model"]["sha256"] == checkpoint_sha256(served.path)

    # one path, one seed, one setting: the tokens generate() draws with that seed, as one trace
    params = SamplingParams(temperature=0.7, top_k=0, seed=3)
    assert generate(served.model, served.tokenizer, PROMPT, params, max_tokens=5).token_ids == path
    run = _recomputed(served, params, 5, "run")
    assert post("/explain/traces/diff", {"a": _texts(got["lines"]), "b": _texts([run.header, *run.steps, run.end])}
                ).json()["identical"]
    earlier = post(f"/explain/sessions/{key}/trace", {"node": steps[1]["child"]}).json()
    assert parse_trace(_texts(earlier["lines"]), "two steps").token_ids == path[:2]

    post(f"/explain/sessions/{key}/step", {"temperature": 1.2, "top_k": 0})  # other dials: not one run
    mixed = post(f"/explain/sessions/{key}/trace", {})
    error = mixed.json()["error"]
    assert mixed.status_code == 400 and error["param"] == "node" and "step 6" in error["message"]
    assert "(temperature)" in error["message"]
    for body, status, param in (({"node": 10_000}, 400, "node"), ({"node": -1}, 400, "node"),
                                ({"nodes": 1}, 400, "nodes")):
        bad = post(f"/explain/sessions/{key}/trace", body)
        assert bad.status_code == status and bad.json()["error"]["param"] == param, bad.text
    assert post("/explain/sessions/nosuch/trace", {}).status_code == 404


def test_speculative_greedy_is_plain_greedy_and_shows_each_refusal(live):
    post, served = live
    view = post("/explain/experiments/speculative",
                {"prompt": REPEATING, "max_tokens": 24, "draft_tokens": 4, "temperature": 0}).json()
    ids = [t["id"] for t in view["tokens"]]
    plain = generate(served.model, served.tokenizer, REPEATING, SamplingParams(temperature=0), max_tokens=24)
    assert ids == plain.token_ids and view["text"] == plain.text
    states = [t["state"] for t in view["tokens"]]
    assert states[0] == "undrafted" and states.count("accepted") == view["accepted"] >= 1
    assert states.count("rejected") == view["rejected"] >= 1
    assert view["acceptance"] == pytest.approx(view["accepted"] / view["drafted"], rel=1e-4)
    assert view["drafted"] >= view["accepted"] + view["rejected"]
    assert view["tokens_per_forward"] == pytest.approx((len(ids) - 1) / view["forwards"], rel=1e-4)
    prompt_ids = prompt_ids_for(served.model, served.tokenizer, REPEATING)
    for i, token in enumerate(view["tokens"]):
        if token["state"] != "rejected":
            assert "proposal" not in token and "rows" not in token
            continue
        probs = _softmax_at(served, prompt_ids + ids[:i])  # the model's own distribution at that prefix
        top = torch.topk(probs, 10)
        assert [r["id"] for r in token["rows"]] == top.indices.tolist()
        assert [r["p"] for r in token["rows"]] == pytest.approx(top.values.tolist(), rel=1e-4, abs=1e-7)
        proposal = token["proposal"]
        assert proposal["p"] == pytest.approx(float(probs[proposal["id"]]), rel=1e-4, abs=1e-7)
        assert proposal["id"] != token["id"] == int(probs.argmax())  # greedy refused it for the top token


def test_speculative_sampling_is_the_librarys_and_fields_are_bounded(live):
    post, served = live
    view = post("/explain/experiments/speculative",
                {"prompt": REPEATING, "max_tokens": 12, "temperature": 1.0, "seed": 7}).json()
    rounds = Rounds()
    steps = list(speculative_stream(served.model, served.tokenizer, REPEATING, SamplingParams(temperature=1.0, seed=7),
                                    NgramDrafter(), k=5, rounds=rounds, max_tokens=12, top_n=10))
    assert [t["id"] for t in view["tokens"]] == [s.token_id for s in steps]
    assert (view["drafted"], view["accepted"], view["forwards"]) == (rounds.drafted, rounds.accepted, rounds.forwards)
    assert view["greedy"] is False and view["draft_tokens"] == 5
    for body, param in (({"prompt": REPEATING, "draft_tokens": 0}, "draft_tokens"),
                        ({"prompt": REPEATING, "draft_tokens": 17}, "draft_tokens"),
                        ({"prompt": REPEATING, "max_tokens": 1000}, "max_tokens"),
                        ({"prompt": REPEATING, "temperature": 2.5}, "temperature"),
                        ({"prompt": REPEATING, "temperature": "0"}, "temperature"),
                        ({"prompt": REPEATING, "seed": -1}, "seed"),
                        ({"prompt": ""}, "prompt"), ({"prompt": REPEATING, "drafter": "model"}, "drafter")):
        bad = post("/explain/experiments/speculative", body)
        error = bad.json()["error"]
        assert bad.status_code == 400 and error["param"] == param and "\n" not in error["message"], bad.text
