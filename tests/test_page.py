"""The explainer page in headless Chromium (Debian's /usr/bin/chromium, driven by Playwright).

What the page shows after a dial moves is checked against nexttok.generation.sampling run here on the same
logits: the probabilities after the chain, each stage's kept count and entropy, the cut rows and
the token the step's draw picks."""

from __future__ import annotations

import json
import re

import pytest
import torch

from nexttok.generation.parameters import DIALS, PARAMETERS
from nexttok.generation.sampling import SamplerChain, SamplingParams
from nexttok.generation.stages import DEFAULT_ORDER, STAGES
from nexttok.lesson import sections as lesson

PROMPT = "The capital of France is"
NEUTRAL = {name: PARAMETERS[name].default for name in DIALS}  # every stage's dials at their neutral value


class NodeNumbers:
    """The random numbers the session's node holds (the draw's u, XTC's chance), as a chain's stream."""

    def __init__(self, draws: dict):
        self.draws = draws

    def next(self, purpose: str = "draw") -> float:
        return self.draws[purpose]


@pytest.fixture(scope="module")
def live(tiny_live):
    return tiny_live


def _set_dial(page, name: str, value) -> None:
    page.eval_on_selector(f"#{name}", "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                          str(value))


def _set_dials(page, settings: dict) -> dict:
    """Move dials; wait until the page shows the server's answer for exactly these settings."""
    for name, value in settings.items():
        _set_dial(page, name, value)
    page.wait_for_function("""(want) => {
        const shown = document.querySelector('#table').dataset.dials;
        if (!shown) return false;
        const got = JSON.parse(shown);
        return Object.entries(want).every(([k, v]) => got[k] === v);
    }""", arg=settings)
    return json.loads(page.get_attribute("#table", "data-dials"))


def _check_against_sampling(page, served, explainer, prompt_ids: list[int], step_draw: float) -> None:
    """The page's rows, stages and pick equal SamplerChain's on the step's logits, with its u."""
    shown = json.loads(page.get_attribute("#table", "data-dials"))
    params = SamplingParams(**shown)
    generated = [int(x) for x in page.locator("#tokens .chip.generated").evaluate_all("els => els.map(e => e.dataset.id)")]
    path = generated[:-1]  # the table belongs to the step that made the last token
    # the session's own logits of that step: a forward recomputed here (other shapes, other last
    # bits) can reorder near-equal probabilities in the tail and so move an inverse-CDF pick
    (opened,) = explainer.sessions.values()
    node = opened.session.nodes[opened.session.current].parent
    assert opened.session.path(node) == path
    logits = opened.session.forward(node).logits
    chain = SamplerChain.from_params(params, served.model.config.vocab_size, prompt_ids, tokenizer=served.tokenizer,
                                     uniforms=NodeNumbers(opened.session.nodes[node].draws))
    for token in path:
        chain.accept(token)
    chosen = chain.sample(logits, record=True, u=None if chain.greedy else step_draw)
    token, u, records = chosen.token_id, chosen.draw, chosen.stages
    q = chosen.logits.softmax(-1)
    rows = page.locator("#table tbody tr:not(.rest)").evaluate_all(
        "els => els.map(e => [Number(e.dataset.id), Number(e.dataset.q), e.classList.contains('cut'), "
        "e.querySelector('.final-p').textContent])")
    assert len(rows) == 10
    for token_id, shown_q, cut, text in rows:
        assert shown_q == pytest.approx(float(q[token_id]), abs=1e-5), (token_id, shown)
        assert cut == (float(q[token_id]) == 0)
        if cut:
            assert text == f"cut by {next(r.name for r in records if token_id in r.cut)}"
    stages = page.locator("#stages li").evaluate_all(
        "els => els.map(e => [e.dataset.stage, Number(e.dataset.kept), Number(e.dataset.entropy)])")
    assert [s[0] for s in stages] == [r.name for r in records] + ["draw"]
    assert [s[1] for s in stages[:-1]] == [r.kept for r in records]
    assert [s[2] for s in stages[:-1]] == pytest.approx([r.entropy for r in records], abs=1e-4)
    assert int(page.get_attribute("#redraw", "data-token")) == token
    draw = page.get_attribute("#redraw", "data-draw")
    assert (draw == "") if u is None else (float(draw) == step_draw)


def _check_attention(page, explainer) -> None:
    """The last position's view shows the step's own weights: a head's as the step sent them, and
    for "mean" the server's mean over the layer's heads (the page averages nothing itself). The page
    names its session and the table's node in data-* attributes (it keeps no global)."""
    (key, opened), = explainer.sessions.items()
    session = opened.session
    assert page.get_attribute("#tokens", "data-session") == key
    node = int(page.get_attribute("#table", "data-node"))
    assert node == session.nodes[session.current].parent  # the table is the step that made the last token
    attention = session.forward(node).attention  # per layer (n_head, S)
    weights = lambda: page.locator("#attention .att").evaluate_all(  # noqa: E731
        "els => els.map(e => Number(e.dataset.weight))")
    assert page.input_value("#head") == "mean" and page.input_value("#layer") == "0"
    assert weights() == pytest.approx(attention[0].mean(0).tolist(), abs=2e-4)
    page.select_option("#layer", "1")
    assert weights() == pytest.approx(attention[1].mean(0).tolist(), abs=2e-4)
    page.select_option("#head", "1")
    assert weights() == pytest.approx(attention[1][1].tolist(), abs=1e-4)
    assert attention[1][1].tolist() != pytest.approx(attention[1].mean(0).tolist(), abs=1e-3)  # a head is not the mean
    page.select_option("#layer", "0")
    page.select_option("#head", "mean")


def _start_and_step(page, server, served, steps: int) -> list[int]:
    page.goto(server.url + "/")
    page.wait_for_selector("#dials[data-ready] #temperature")
    page.fill("#prompt", PROMPT)
    page.click("#start")
    page.wait_for_selector("#tokens .chip.prompt")
    for n in range(1, steps + 1):
        page.click("#step")
        page.wait_for_function(f"document.querySelectorAll('#tokens .chip.generated').length === {n}")
    return served.tokenizer.encode(PROMPT)


def test_explainer_page(browser, live):
    server, served = live
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    explainer = server.server.app.state.explainer  # its session's logits are the oracle's input
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    vocab: list[str] = []  # the vocabulary is fetched once per page load, not with each session
    page.on("request", lambda r: vocab.append(r.url) if "/explain/vocab" in r.url else None)
    ids = _start_and_step(page, server, served, 3)
    assert len(vocab) == 1

    chips = page.locator("#tokens .chip.prompt")
    assert chips.count() == len(ids)
    assert [int(chips.nth(i).get_attribute("data-id")) for i in range(len(ids))] == ids
    assert chips.nth(1).inner_text() == " capital"
    assert f"id {ids[1]}" in chips.nth(1).get_attribute("title") and "bytes 20 63" in chips.nth(1).get_attribute("title")

    rows = page.locator("#table tbody tr:not(.rest)")
    assert rows.count() == 10
    chosen = int(page.locator("#tokens .chip.generated").last.get_attribute("data-id"))
    listed = [int(rows.nth(i).get_attribute("data-id")) for i in range(10)]
    assert page.locator("#table tbody tr.chosen").count() == (1 if chosen in listed else 0)
    if chosen in listed:
        assert int(page.get_attribute("#table tbody tr.chosen", "data-id")) == chosen
    assert "everything else" in page.locator("#table tbody tr.rest").inner_text()
    assert "rank" in page.inner_text("#chosen") and "draw u" in page.inner_text("#chosen")
    assert "tokens/s" in page.inner_text("#timing")
    assert page.locator("#attention .att").count() == len(ids) + 2  # keys of the last step
    _check_attention(page, explainer)
    assert page.evaluate("typeof window.nexttok") == "undefined"  # ES modules: no global
    draw = float(page.get_attribute("#redraw", "data-draw"))
    assert 0 <= draw < 1 and f"draw u = {draw:.3f}" in page.inner_text("#chosen")
    _check_against_sampling(page, served, explainer, ids, draw)  # as stepped: the neutral dials build no stage

    for settings in ({"temperature": 0.3}, {"temperature": 1, "top_k": 3}, {"top_k": 0, "top_p": 0.5, "min_p": 0.1},
                     {"top_p": 1, "min_p": 0, "repetition_penalty": 1.8, "presence_penalty": 1, "temperature": 0.7},
                     {"temperature": 0, "frequency_penalty": -1.5},
                     {"temperature": 1, "frequency_penalty": 0, "dry_multiplier": 2, "dry_allowed_length": 1,
                      "xtc_probability": 1, "xtc_threshold": 0.02, "typical_p": 0.95, "top_n_sigma": 3,
                      "dynatemp_range": 0.5},
                     {**NEUTRAL, "mirostat": 2, "mirostat_tau": 2, "temperature": 0.8}):
        _set_dials(page, settings)
        _check_against_sampling(page, served, explainer, ids, draw)
        if settings.get("top_k") == 3:
            assert page.locator("#table tbody tr.cut").count() >= 7  # top-k 3 cuts all but three rows
        if settings.get("xtc_probability"):  # what XTC decided, and by how much DRY moved a logit (if it did)
            assert "chance " in page.inner_text("#stages li[data-stage=xtc]")
            assert "T = " in page.inner_text("#stages li[data-stage=temperature]")
        if settings.get("mirostat"):
            assert page.inner_text("#stages li[data-stage=mirostat]").startswith("mirostat: ")
            assert "mu 4.000" in page.inner_text("#stages li[data-stage=mirostat]")
    _set_dials(page, NEUTRAL)

    for _ in range(len(DEFAULT_ORDER) - 1):  # temperature first: ↑ once per stage before it
        page.click("#order li[data-stage=temperature] button")
    order = page.locator("#order li").evaluate_all("els => els.map(e => e.dataset.stage)")
    assert order == ["temperature", *(name for name in DEFAULT_ORDER if name != "temperature")]
    for value in (0.2, 0.4, 0.6, 0.8):  # quick moves: debounced, and only the last answer is shown
        _set_dial(page, "top_p", value)
    shown = _set_dials(page, {"temperature": 0.5, "top_p": 0.6, "repetition_penalty": 1.5})
    assert shown["order"] == order
    page.wait_for_timeout(400)
    assert json.loads(page.get_attribute("#table", "data-dials")) == shown
    _check_against_sampling(page, served, explainer, ids, draw)
    names = page.locator("#stages li").evaluate_all("els => els.map(e => e.dataset.stage)")
    assert names == ["raw", "temperature", "penalties", "top_p", "draw"]
    _set_dials(page, NEUTRAL)

    # a branch, read as a learner reads it: the visible rows (rank, token, id) are the model's own
    # top 10 of the step, and clicking one whose id is not the chosen one's makes that token the last
    (opened,) = explainer.sessions.values()
    logits = opened.session.forward(opened.session.nodes[opened.session.current].parent).logits
    cells = page.locator("#table tbody tr:not(.rest)").evaluate_all(
        "els => els.map(e => [...e.querySelectorAll('td')].slice(0, 3).map(td => td.textContent))")
    assert [int(c[2]) for c in cells] == torch.topk(logits.float(), 10).indices.tolist()
    visible = lambda t: t.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t")  # noqa: E731
    assert [c[1] for c in cells] == [visible(p.text) for p in served.tokenizer.pieces([int(c[2]) for c in cells])]
    chosen_id = int(re.search(r"\(id (\d+)\)", page.inner_text("#chosen")).group(1))
    rank, text, alt = next(c for c in cells if int(c[2]) != chosen_id)
    page.locator("#table tbody tr:not(.rest)").nth(int(rank) - 1).click()
    page.wait_for_function(f"document.querySelector('#tokens .chip.generated:last-child').textContent === "
                           f"{json.dumps(text.replace('␣', ' ').replace(chr(92) + 't', chr(9)))}")
    assert page.locator("#tokens .chip.generated").count() == 3  # same depth, other branch
    assert f"(id {alt})" in page.inner_text("#chosen")
    assert int(page.get_attribute("#tree", "data-branches")) >= 1

    page.click("#step")
    page.wait_for_function("document.querySelectorAll('#tokens .chip.generated').length === 4")
    page.wait_for_function("document.querySelector('#table').dataset.dials !== undefined")
    _check_against_sampling(page, served, explainer, ids, float(page.get_attribute("#redraw", "data-draw")))
    # what each part says, in its visible text (not a count of inked pixels)
    assert page.locator("#tokens .chip").count() == len(ids) + 4 and page.inner_text("#tokens").startswith("The")
    dials = page.inner_text("#dials")
    assert all(label in dials for label in ("temperature", "top k", "top p", "min p", "repetition penalty"))
    for spec in STAGES:  # every stage with a number setting: its dials, and when people use it
        if any(name in DIALS for name in spec.settings):
            box = page.inner_text(f"#dials fieldset[data-stage={spec.name}]")
            assert spec.use in box and all(name.replace("_", " ") in box for name in spec.settings if name in DIALS)
    assert page.locator("#table tbody tr").count() == 11 and "everything else" in page.inner_text("#table")
    stages = page.locator("#stages li").all_inner_texts()
    assert stages[0].startswith("raw: ") and "tokens kept, entropy" in stages[0] and stages[-1].startswith("draw")
    last = int(page.locator("#tokens .chip.generated").last.get_attribute("title").split()[1])
    assert stages[-1].endswith(f"(id {last})")  # the draw names the token the page then shows last
    drawn = page.locator("#stages li[data-stage=draw]").text_content()  # named from the vocabulary route
    assert f"{json.dumps(lesson.token_text(served.tokenizer, last), ensure_ascii=False)} (id {last})" in drawn
    assert page.locator("#attention .att").count() == len(ids) + 3  # keys of the last step
    assert "tokens/s" in page.inner_text("#timing")
    for part in ("#tokens", "#dials", "#table", "#stages", "#attention", "#tree", "#timing"):
        assert page.locator(part).is_visible(), part
    before = page.get_attribute("#tokens", "data-session")
    page.click("#start")  # a new session on the same model: the page has its vocabulary already
    page.wait_for_function("(key) => document.querySelector('#tokens').dataset.session !== key", arg=before)
    assert len(vocab) == 1
    assert not errors, errors
