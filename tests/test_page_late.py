"""Sections 6-11 of the explainer page (lesson-late.js) in headless Chromium.

Each view is checked against the numbers the page received from the server (its responses are
recorded as it runs) and, where Python has them, against nexttok itself: the logits beside their
probabilities, the cumulative bar of the draw and where u lands, the loop's inputs, the KV cache's
bytes, the stop probability per step, the context window's refusal, the experiments and the quiz
answers computed from their demonstrations."""

from __future__ import annotations

import json
from urllib.parse import urlparse

import pytest

from nexttok.generation.diff import diff_traces
from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.trace import parse_trace, read_trace
from nexttok.lesson import sections as lesson

PROMPT = "The capital of France is"
REPEATING = "one two three four one two three four one two"  # greedy drafts here are taken and refused
LATE = ["#sec-logits", "#sec-sampling", "#sec-loop", "#sec-stop", "#sec-context", "#sec-experiments"]
REFUSED_LOAD = "Failed to load resource: the server responded with a status of 400"


@pytest.fixture(scope="module")
def live(tiny_live):
    return tiny_live


class Recorder:
    """A page with its console errors and the explainer responses it received, in order."""

    def __init__(self, browser, width: int):
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.errors: list[str] = []
        self.responses: list = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("response", lambda r: self.responses.append(r) if "/explain/" in r.url else None)

    def answers(self, suffix: str, status: int = 200, session: str | None = None) -> list[tuple[dict, dict]]:
        """(request body, response JSON) of every POST to a path ending in suffix (on one session)."""
        found = []
        for r in self.responses:
            path = urlparse(r.url).path
            if r.request.method == "POST" and path.endswith(suffix) and r.status == status and (
                    session is None or path.startswith(f"/explain/sessions/{session}/")):
                found.append((json.loads(r.request.post_data or "null"), r.json()))
        return found

    def steps(self) -> list[tuple[dict, dict]]:
        """The steps of the page's own session (the one it shows now)."""
        key = self.page.get_attribute("#tokens", "data-session")  # the page exposes its session there
        assert key is not None
        return self.answers("/step", session=key)

    def unexpected_errors(self, allowed_400: int = 0) -> list[str]:
        refused = [e for e in self.errors if e.startswith(REFUSED_LOAD)]
        others = [e for e in self.errors if not e.startswith(REFUSED_LOAD)]
        return others + (refused if len(refused) > allowed_400 else [])


def _start(rec: Recorder, server, steps: int) -> None:
    page = rec.page
    page.goto(server.url + "/")
    page.wait_for_selector("#dials[data-ready] #temperature")
    page.fill("#prompt", PROMPT)
    page.click("#start")
    page.wait_for_selector("#tokens .chip.prompt")
    for _ in range(steps):
        _step(page)


def _step(page) -> None:
    before = page.locator("#tokens .chip.generated").count()
    page.click("#step")
    page.wait_for_function(f"document.querySelectorAll('#tokens .chip.generated').length === {before + 1}")
    page.wait_for_function("document.querySelector('#draw-bar').dataset.node !== undefined")


def _open(page, *sections: str) -> None:
    for section in sections:
        page.eval_on_selector(section, "el => { el.open = true; }")


def _data(page, selector: str) -> dict:
    return page.eval_on_selector(selector, "el => ({...el.dataset})")


def _set_dials(page, settings: dict) -> None:
    """Move dials and wait until the page shows the server's answer for exactly these settings."""
    for name, value in settings.items():
        page.eval_on_selector(f"#{name}", "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                              str(value))
    page.wait_for_function("""(want) => {
        const shown = document.querySelector('#table').dataset.dials;
        return shown && Object.entries(want).every(([k, v]) => JSON.parse(shown)[k] === v);
    }""", arg=settings)


def _path(view: dict) -> list[int]:
    """The nodes from the prompt down to the view's current node (the prompt's node left out)."""
    nodes = {n["id"]: n for n in view["tree"]}
    found, node = [], nodes[view["current"]]
    while node["parent"] is not None:
        found.append(node["id"])
        node = nodes[node["parent"]]
    return found[::-1]


def _series(page, selector: str, name: str) -> list[list[float]]:
    return json.loads(page.get_attribute(f'{selector} path.series[data-name="{name}"]', "data-points"))


def _check_logits(page, view: dict) -> None:
    shown = page.locator("#logit-bars g.logit-row").evaluate_all(
        "els => els.map(e => [Number(e.dataset.id), Number(e.dataset.logit), Number(e.dataset.p)])")
    assert shown == [[r["id"], pytest.approx(r["logit"]), pytest.approx(r["p"])] for r in view["rows"]]
    rest = _data(page, "#logit-rest")
    assert int(rest["tokens"]) == view["rest"]["tokens"] and float(rest["p"]) == pytest.approx(view["rest"]["p"])
    masses = page.locator("#logit-mass rect.segment").evaluate_all("els => els.map(e => Number(e.dataset.value))")
    assert masses == pytest.approx([r["p"] for r in view["rows"]] + [view["rest"]["p"]])
    top, second = view["rows"][:2]
    assert float(_data(page, "#logit-ratio")["gap"]) == pytest.approx(top["logit"] - second["logit"])


def _check_draw(page, drawn: dict) -> None:
    """The bar's segments are the kept tokens' q from most to least likely (then the kept tokens
    outside the table as one block); the mark is the step's u, inside the picked token's segment."""
    kept = sorted((r for r in drawn["rows"] if r["q"] > 0), key=lambda r: -r["q"])
    want_ids: list = [r["id"] for r in kept]
    want = [r["q"] for r in kept]
    if drawn["rest"]["kept"] > len(kept) and drawn["rest"]["q"] > 0:
        want_ids.append(None)
        want.append(drawn["rest"]["q"])
    segments = page.locator("#draw-bar rect.segment").evaluate_all(
        "els => els.map(e => [Number(e.dataset.start), Number(e.dataset.value)])")
    assert [v for _, v in segments] == pytest.approx(want)
    box = _data(page, "#draw-bar")
    assert json.loads(box["ids"]) == want_ids
    step = drawn["step"]
    assert int(box["picked"]) == step["token_id"]
    marks = page.locator("#draw-bar path.mark")
    if step["draw"] is None:
        assert marks.count() == 0 and box["draw"] == ""
        assert "Temperature 0" in page.inner_text("#draw-note")
        return
    u = float(marks.get_attribute("data-value"))
    assert u == step["draw"] == float(box["draw"])
    where = want_ids.index(step["token_id"]) if step["token_id"] in want_ids else want_ids.index(None)
    start, value = segments[where]
    assert start - 1e-9 <= u < start + value + 1e-9, (u, start, value)
    assert page.locator("#draw-table tr.hit").get_attribute("data-id") == str(want_ids[where] or "rest")


def _check_loop(page, rec: Recorder, served) -> None:
    views = {view["child"]: view for _, view in rec.steps()}
    last = rec.steps()[-1][1]
    on_path = [views[n] for n in _path(last) if n in views]
    prompt_ids = [int(x) for x in page.locator("#tokens .chip.prompt").evaluate_all("els => els.map(e => e.dataset.id)")]
    items = page.locator("#loop-list li").evaluate_all(
        "els => els.map(e => [Number(e.dataset.node), JSON.parse(e.dataset.fed), e.dataset.cached])")
    assert [i[0] for i in items] == [v["child"] for v in on_path][-len(items):]
    for (_, fed, cached), view in zip(items, on_path[-len(items):], strict=True):
        context = prompt_ids + [t["id"] for t in view["generated"]][:-1]
        assert fed == context[len(context) - view["timing"]["tokens"]:]
        assert cached == ("false" if view["timing"]["cached"] is False else "true")
    for name, uses in (("with the KV cache", True), ("without the KV cache", False)):
        want = [[v["step"]["index"] + 1, v["timing"]["seconds"] * 1000] for v in on_path if v["timing"]["cached"] is uses]
        if want:
            assert _series(page, "#loop-times", name) == [[x, pytest.approx(y)] for x, y in want]
    cache = _data(page, "#loop-cache")
    dtype = next(served.model.parameters()).dtype
    per_token = lesson.kv_cache_bytes_per_token(served.model, dtype)
    assert int(cache["perToken"]) == per_token == last["cache"]["bytes_per_token"]
    assert int(cache["bytes"]) == int(cache["tokens"]) * per_token == last["cache"]["bytes"]
    assert int(cache["tokens"]) == last["cache"]["tokens"] and cache["dtype"] == str(dtype).removeprefix("torch.")


def _check_stop(page, rec: Recorder) -> None:
    views = {view["child"]: view for _, view in rec.steps()}
    last = rec.steps()[-1][1]
    want = [[views[n]["step"]["index"] + 1, views[n]["stop"]["p"]] for n in _path(last) if n in views]
    assert json.loads(page.get_attribute("#stop-plot", "data-p")) == [p for _, p in want]
    assert _series(page, "#stop-plot", "p(stop) in %") == [[x, pytest.approx(100 * p)] for x, p in want]
    assert page.get_attribute("#stop-reason", "data-reason") == (last["stop"]["reason"] or "")
    assert f"(id {last['stop']['ids'][0]})" in page.inner_text("#stop-tokens")


def test_step_sections(browser, live):
    server, served = live
    rec = Recorder(browser, 1280)
    page = rec.page
    _start(rec, server, 3)
    steps = rec.answers("/step")
    assert len(steps) == 3
    _check_logits(page, steps[-1][1])
    _check_draw(page, steps[-1][1])

    for settings in ({"temperature": 0.7, "top_k": 5}, {"top_k": 0, "top_p": 0.6, "repetition_penalty": 1.5},
                     {"temperature": 0}):
        _set_dials(page, settings)
        _check_draw(page, rec.answers("/redraw")[-1][1])
    _set_dials(page, {"temperature": 1, "top_p": 1, "repetition_penalty": 1})

    alternative = page.locator("#table tbody tr:not(.chosen):not(.rest)").first  # a branch: chosen, not drawn
    chosen = int(alternative.get_attribute("data-id"))
    alternative.click()
    page.wait_for_function(f"document.querySelector('#tokens .chip.generated:last-child').dataset.id === '{chosen}'")
    page.wait_for_function("document.querySelector('#draw-note').textContent.includes('went on with')")
    redrawn = rec.answers("/redraw")[-1]
    branch = rec.steps()[-1][1]
    assert redrawn[0]["node"] == branch["node"] and branch["step"]["token_id"] == chosen
    _check_draw(page, redrawn[1])

    page.check("#loop-nocache")  # two steps without the cache: the whole text goes through the model
    for _ in range(2):
        _step(page)
    for body, view in rec.answers("/step")[-2:]:
        assert body["use_cache"] is False and view["timing"]["cached"] is False
    page.uncheck("#loop-nocache")
    _step(page)
    assert rec.answers("/step")[-1][0]["use_cache"] is True
    _check_logits(page, rec.answers("/step")[-1][1])
    _check_loop(page, rec, served)

    _open(page, "#sec-stop", "#sec-context")
    _check_stop(page, rec)
    first = _path(rec.steps()[-1][1])[0]  # back at the first generated token: the views follow the path
    page.click(f'#tree span[data-node="{first}"]')
    page.wait_for_function("document.querySelectorAll('#loop-list li').length === 1")
    assert page.get_attribute("#loop-list li", "data-node") == str(first)
    assert len(json.loads(page.get_attribute("#stop-plot", "data-p"))) == 1
    _step(page)
    assert len(json.loads(page.get_attribute("#stop-plot", "data-p"))) == 2
    _check_stop(page, rec)
    context = rec.answers("/step")[-1][1]["context"]
    shown = _data(page, "#ctx-text")
    assert (int(shown["used"]), int(shown["limit"])) == (context["used"], context["limit"])

    page.fill("#ctx-size", "24")
    page.click("#ctx-fill")
    page.wait_for_function("document.querySelector('#ctx-result').dataset.refused !== undefined", timeout=60_000)
    result = _data(page, "#ctx-result")
    refusals = rec.answers("/step", status=400)
    assert result["refused"] == "1" and len(refusals) == 1
    error = refusals[0][1]["error"]
    assert error["code"] == "context_length_exceeded" and result["message"] == error["message"]
    assert error["message"] in page.inner_text("#ctx-result")
    last = rec.answers("/step")[-1][1]
    assert last["context"] == {"used": 23, "limit": 24} and last["stop"]["reason"] == "length"
    assert page.eval_on_selector("#ctx-meter", "m => [m.value, m.max]") == [23, 24]
    assert page.get_attribute("#stop-reason", "data-reason") == "length"
    _check_stop(page, rec)
    assert not rec.unexpected_errors(allowed_400=1), rec.errors


def _check_repeat(page, d: dict, served, prompt: str, max_tokens: int) -> None:
    """Each pair is shown as its diff: both runs' tokens, the parting token outlined and the ones
    after it marked, and a panel with the two candidates, the gap and the verdict."""
    runs = page.locator("#exp-repeat .exp-run").evaluate_all(
        "els => els.map(e => [JSON.parse(e.dataset.tokens), Number(e.dataset.temperature), "
        "[...e.querySelectorAll('.late-chip')].map(c => c.className)])")
    for (ids, temperature, _), run in zip(runs, d["runs"], strict=True):
        assert ids == [t["id"] for t in run["tokens"]] and temperature == run["temperature"]
    greedy = generate(served.model, served.tokenizer, prompt, SamplingParams(temperature=0), max_tokens=max_tokens)
    assert runs[0][0] == runs[1][0] == greedy.token_ids
    for pair, first in (("temperature_0", 0), ("temperature_1", 2)):
        view, box = d["diffs"][pair], f'#exp-repeat .exp-pair[data-pair="{pair}"]'
        _check_diff(page, box, view)
        k = view["index"]
        for classes in (runs[first][2], runs[first + 1][2]):
            assert ["parting" in c for c in classes] == [j == k for j in range(len(classes))]
            assert ["parted" in c for c in classes] == [k is not None and j > k for j in range(len(classes))]
    assert d["diffs"]["temperature_0"]["identical"]
    summary = _data(page, "#exp-repeat-summary")
    for key, pair in (("t0", "temperature_0"), ("t1", "temperature_1")):
        assert summary[key] == ("" if d["divergence"][pair] is None else str(d["divergence"][pair]))


def _check_diff(page, box: str, view: dict) -> None:
    """A diff view shows the route's diff: where the runs part, each candidate's p, the verdict."""
    shown = _data(page, f"{box} .trace-diff")
    assert shown["index"] == ("" if view["index"] is None else str(view["index"]))
    panel = page.locator(f"{box} .diff-panel")
    verdict = panel.locator(".verdict").inner_text()
    if view["identical"]:
        assert verdict.startswith("Identical") and panel.locator("tr[data-run]").count() == 0
        return
    rows = panel.locator("tr[data-run]").evaluate_all(
        "els => els.map(e => [e.dataset.id, e.dataset.p === '' ? null : Number(e.dataset.p)])")
    assert rows == [["", None] if r["at"] is None else [str(r["at"]["id"]), pytest.approx(r["at"]["p"])]
                    for r in view["runs"]]
    if view["gap"] is None:
        assert "ended" in verdict
        return
    assert float(_data(page, f"{box} .diff-panel")["gap"]) == pytest.approx(view["gap"])
    assert ("a near tie" if view["near_tie"] else "not a near tie") in verdict
    assert verdict.startswith("Gap p(A) − p(B) = " + ("+" if view["gap"] >= 0 else "−"))
    bars = panel.locator("rect.cmp").evaluate_all("els => els.map(e => Number(e.dataset.value))")
    assert bars == pytest.approx([r["at"]["p"] for r in view["runs"]])


def _check_length(page, d: dict, lengths: list[int]) -> None:
    assert [r["tokens"] for r in d["runs"]] == lengths
    for r in d["runs"]:
        total, want = 0.0, []
        for i, s in enumerate(r["step_seconds"]):
            total += s
            want.append([i + 1, pytest.approx(total)])
        assert _series(page, "#exp-length-plot", f"{r['tokens']} tokens") == want
    rows = page.locator("#exp-length-table tr[data-tokens]").evaluate_all(
        "els => els.map(e => [Number(e.dataset.tokens), Number(e.dataset.seconds), Number(e.dataset.cost)])")
    assert rows == [[r["tokens"], r["seconds"], r["cost"]] for r in d["runs"]]
    for title, key in (("total time", "seconds"), ("time per token", "seconds_per_token"), ("cost", "cost")):
        values = page.locator(f'#exp-length-bars svg[data-title="{title}"] rect.cmp').evaluate_all(
            "els => els.map(e => Number(e.dataset.value))")
        assert values == [r[key] for r in d["runs"]]


def _ask_quiz(page, name: str) -> tuple[int, dict]:
    page.click(f"#quiz-{name} button.show-me")
    page.wait_for_function(f"document.querySelector('#quiz-{name}').dataset.answer !== undefined", timeout=60_000)
    item = _data(page, f"#quiz-{name}")
    marked = page.locator(f"#quiz-{name} .choices li.correct").evaluate_all("els => els.map(e => Number(e.dataset.choice))")
    assert marked == [int(item["answer"])]
    return int(item["answer"]), json.loads(item["data"])


def _check_quiz(page, rec: Recorder, served) -> None:
    page.check("#quiz-temperature input[value='1']")  # a learner's guess: the verdict names it
    answer, _ = _ask_quiz(page, "temperature")
    d = rec.answers("/experiments/repeat")[-1][1]
    same = [t["id"] for t in d["runs"][0]["tokens"]] == [t["id"] for t in d["runs"][1]["tokens"]]
    assert answer == (0 if same else 1)
    assert ("agrees" if answer == 1 else "not the one") in page.inner_text("#quiz-temperature .evidence")

    answer, data = _ask_quiz(page, "letters")
    body, d = rec.answers("/explain/tokens")[-1]
    assert body["text"] == " strawberry" and [p["id"] for p in d["pieces"]] == served.tokenizer.encode(" strawberry")
    assert data == {"letters": 10, "tokens": d["tokens"], "ids": [p["id"] for p in d["pieces"]]}
    assert answer == (0 if d["tokens"] < 10 else 1)

    answer, data = _ask_quiz(page, "cache")
    demo = [(body, view) for body, view in rec.answers("/step") if body.get("top_n") == 1]
    assert [b["use_cache"] for b, _ in demo] == [True] * 6 + [False] * 6
    for kind, part in (("cached", demo[:6]), ("uncached", demo[6:])):
        assert data[kind] == [{"index": v["step"]["index"], "tokens": v["timing"]["tokens"],
                               "seconds": v["timing"]["seconds"], "cached": v["timing"]["cached"]} for _, v in part]
    uncached_tokens = [r["tokens"] for r in data["uncached"]]
    assert uncached_tokens == list(range(uncached_tokens[0], uncached_tokens[0] + 6))
    assert [r["tokens"] for r in data["cached"][1:]] == [1] * 5
    mean = {k: sum(r["seconds"] for r in data[k][1:]) / 5 for k in ("cached", "uncached")}
    want = 0 if mean["uncached"] > mean["cached"] else 2 if mean["uncached"] < mean["cached"] else 1
    assert answer == want

    answer, data = _ask_quiz(page, "length")
    d = rec.answers("/experiments/length")[-1][1]
    short, long = sorted(d["runs"], key=lambda r: r["tokens"])
    assert data == {"short": short, "long": long}
    more = [long[k] > short[k] for k in ("seconds", "cost")]
    less = [long[k] < short[k] for k in ("seconds", "cost")]
    assert answer == (0 if all(more) else 1 if all(less) else 2)


def test_experiments_at_400px(browser, live):
    """Experiments and quiz on a phone-sized page; every late section open and filled still fits."""
    server, served = live
    rec = Recorder(browser, 400)
    page = rec.page
    _start(rec, server, 2)
    _open(page, *LATE)
    page.fill("#exp-prompt", PROMPT)
    page.fill("#exp-max", "6")
    page.fill("#exp-lengths", "3, 12")

    page.click("#exp-repeat-run")
    page.wait_for_function("document.querySelectorAll('#exp-repeat .exp-run').length === 4")
    body, d = rec.answers("/experiments/repeat")[-1]
    assert body == {"prompt": PROMPT, "max_tokens": 6, "seed": 0}
    _check_repeat(page, d, served, PROMPT, 6)

    page.click("#exp-length-run")
    page.wait_for_function("document.querySelectorAll('#exp-length-table tr[data-tokens]').length === 2",
                           timeout=60_000)
    body, d = rec.answers("/experiments/length")[-1]
    assert body["lengths"] == [3, 12]
    _check_length(page, d, [3, 12])

    page.click("#spec-run")  # the default prompt, its tokens and a refusal's bars fit the width too
    page.wait_for_selector("#spec-tokens .late-chip")
    assert rec.answers("/experiments/speculative")[-1][0]["prompt"].startswith("Copy the text exactly.")

    _check_quiz(page, rec, served)
    for section in LATE:
        assert page.eval_on_selector(section, "el => el.open")
    for filled in ("#logit-bars svg", "#draw-bar svg", "#loop-list li", "#loop-times svg", "#stop-plot svg",
                   "#exp-length-plot svg", "#quiz-cache .quiz-plot svg"):
        assert page.locator(filled).count() >= 1, filled
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    assert not rec.unexpected_errors(), rec.errors


def test_bad_lengths_are_refused_on_the_page(browser, live):
    server, _ = live
    rec = Recorder(browser, 1280)
    page = rec.page
    page.goto(server.url + "/")
    _open(page, "#sec-experiments")
    page.fill("#exp-lengths", "3, 5000")
    page.click("#exp-length-run")
    assert "1 to 1000" in page.inner_text("#length-error")
    assert not rec.answers("/experiments/length")
    page.fill("#exp-max", "500")  # past the route's limit: the server's 400 names the parameter, on one line
    page.click("#exp-repeat-run")
    page.wait_for_function("document.querySelector('#repeat-error').textContent !== ''")
    assert "max_tokens" in page.inner_text("#repeat-error")
    assert not rec.unexpected_errors(allowed_400=1), rec.errors


def _lines(lines: list[dict]) -> list[str]:
    return [json.dumps(line, ensure_ascii=False) for line in lines]


def test_traces_are_compared_loaded_and_downloaded(browser, live, tmp_path):
    """(c): the session's trace as A, a trace file as B; the diff is the route's, which is
    diff_traces of the two; a truncated file is one line of error; the download is the session's."""
    server, _ = live
    rec = Recorder(browser, 1280)
    page = rec.page
    _start(rec, server, 3)
    _open(page, "#sec-experiments")
    page.fill("#exp-max", "6")
    page.click("#exp-repeat-run")
    page.wait_for_function("document.querySelectorAll('#exp-repeat .exp-run').length === 4")
    run = rec.answers("/experiments/repeat")[-1][1]["runs"][2]
    file = tmp_path / "run-3.jsonl"
    file.write_text("\n".join(_lines(run["trace"])) + "\n", encoding="utf-8")

    page.click("#trace-session-a")
    page.wait_for_function("document.querySelector('#trace-name-a').textContent.includes('3 steps')")
    page.set_input_files("#trace-file-b", str(file))
    page.wait_for_function("document.querySelector('#trace-name-b').textContent.includes('run-3.jsonl')")
    page.click("#trace-compare")
    page.wait_for_selector("#trace-diff .trace-diff")
    session = rec.answers("/trace")[-1][1]
    body, view = rec.answers("/traces/diff")[-1]
    assert [json.loads(line) for line in body["a"]] == session["lines"]
    assert body["b"] == _lines(run["trace"]) and body["name_b"] == "run-3.jsonl"
    reference = diff_traces(parse_trace(body["a"], "A"), parse_trace(body["b"], "B"))
    assert view["index"] == (None if reference.identical else reference.divergence.index)
    assert [r["tokens"] for r in view["runs"]][1] == run["tokens"]
    _check_diff(page, "#trace-diff", view)

    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(_lines(run["trace"][:-1])) + "\n", encoding="utf-8")
    page.set_input_files("#trace-file-b", str(cut))
    page.wait_for_function("document.querySelector('#trace-name-b').textContent.includes('cut.jsonl')")
    page.click("#trace-compare")
    page.wait_for_function("document.querySelector('#traces-error').textContent !== ''")
    error = page.inner_text("#traces-error")
    assert "cut.jsonl: truncated: no end line after 6 steps" in error and "\n" not in error
    assert page.locator("#trace-diff .trace-diff").count() == 0

    with page.expect_download() as download:
        page.click("#trace-download")
    saved = tmp_path / "session.jsonl"
    download.value.save_as(saved)
    assert read_trace(saved).token_ids == [t["id"] for t in rec.steps()[-1][1]["generated"]]
    assert not rec.unexpected_errors(allowed_400=1), rec.errors


def test_speculative_tokens_show_their_drafts(browser, live):
    """(d): each token carries its draft's fate; a refused one shows the proposal beside the model's
    distribution, as the route sent them."""
    server, _ = live
    rec = Recorder(browser, 1280)
    page = rec.page
    page.goto(server.url + "/")
    _open(page, "#sec-experiments")
    page.fill("#spec-prompt", REPEATING)
    page.fill("#spec-max", "24")
    page.fill("#spec-k", "4")
    page.click("#spec-run")
    page.wait_for_selector("#spec-tokens .late-chip")
    body, d = rec.answers("/experiments/speculative")[-1]
    assert body == {"prompt": REPEATING, "max_tokens": 24, "draft_tokens": 4, "temperature": 0, "seed": 0}
    chips = page.locator("#spec-tokens .late-chip").evaluate_all(
        "els => els.map(e => [Number(e.dataset.id), e.dataset.state, e.className])")
    assert [[c[0], c[1]] for c in chips] == [[t["id"], t["state"]] for t in d["tokens"]]
    assert all(f"spec-{state}" in cls for _, state, cls in chips)
    states = [t["state"] for t in d["tokens"]]
    assert "accepted" in states and states.count("rejected") >= 2  # the prompt repeats: both happen
    summary = _data(page, "#spec-summary")
    assert (int(summary["accepted"]), int(summary["rejected"])) == (d["accepted"], d["rejected"])

    refused = [t for t in d["tokens"] if t["state"] == "rejected"]
    for token in (refused[0], refused[-1]):  # the first is shown at once; a click shows another
        page.click(f'#spec-tokens .late-chip[data-index="{token["index"]}"]')
        page.wait_for_function(f"document.querySelector('#spec-detail .spec-refusal')?.dataset.index === "
                               f"'{token['index']}'")
        shown = _data(page, "#spec-detail .spec-refusal")
        assert (int(shown["proposal"]), int(shown["taken"])) == (token["proposal"]["id"], token["id"])
        assert float(shown["p"]) == pytest.approx(token["proposal"]["p"])
        bars = page.locator("#spec-detail rect.cmp").evaluate_all(
            "els => els.map(e => [Number(e.dataset.id), Number(e.dataset.value), e.getAttribute('fill')])")
        rows = token["rows"] + ([] if any(r["id"] == token["proposal"]["id"] for r in token["rows"])
                                else [token["proposal"]])
        assert [[i, v] for i, v, _ in bars] == [[r["id"], pytest.approx(r["p"])] for r in rows]
        colours = {i: fill for i, _, fill in bars}
        assert colours[token["proposal"]["id"]] != colours[token["id"]]
        assert token["proposal"]["text"].replace(" ", "␣") in page.inner_text("#spec-detail")
    assert not rec.unexpected_errors(), rec.errors
