"""Sections 1-5 of the explainer page (lesson-early.js) in headless Chromium: tokens and cost,
embeddings, position, the attention matrix and one head by hand, the logit lens. What each view
shows (its data-* attributes) is checked against the lesson's routes and the nexttok.lesson.sections
functions run here on the served model; the capture views are fetched only while their section
is open; at 400 px nothing runs off the page; no console errors."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
import torch.nn.functional as F

from nexttok.lesson import sections as lesson

PRESET = "The animal didn't cross the street because it was too tired"
CAPTURES = ("/lens", "/attention", "/attention/detail")


@pytest.fixture(scope="module")
def live(tiny_live):
    return tiny_live


@pytest.fixture(scope="module")
def learned_live(tmp_path_factory, gpt2_dir):
    """A tiny GPT-2 (learned position table) over the GPT-2 vocabulary, served."""
    from live_server import LiveServer
    from nexttok.server import create_app, load_served
    from tiny_models import write_tiny_with_gpt2_tokenizer

    directory = tmp_path_factory.mktemp("gpt2_positions")
    write_tiny_with_gpt2_tokenizer("gpt2", directory, gpt2_dir)
    served = load_served(str(directory), "tiny-gpt2")
    with LiveServer(create_app([served])) as server:
        yield server, served


def _page(browser, server, width: int = 1280):
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_selector("#dials[data-ready] #temperature")
    return page, errors


def _data(page, selector: str, name: str):
    return json.loads(page.get_attribute(selector, f"data-{name}"))


def _cells(page, selector: str) -> torch.Tensor:
    """The matrix a Plot.heatmap draws, read back from its cells' data-row/col/value."""
    cells = page.locator(f"{selector} rect.cell").evaluate_all(
        "els => els.map(e => [Number(e.dataset.row), Number(e.dataset.col), Number(e.dataset.value)])")
    matrix = torch.zeros(max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1)
    for i, j, v in cells:
        matrix[i, j] = v
    return matrix


def _session_key(page) -> str:
    """The page's session, as it exposes it (no global): #tokens[data-session]."""
    return page.get_attribute("#tokens", "data-session")


def _shown_node(page) -> int:
    """The node whose step the table shows: #table[data-node]."""
    return int(page.get_attribute("#table", "data-node"))


def _open(page, section: str) -> None:
    if not page.evaluate(f"document.getElementById('sec-{section}').open"):
        page.click(f"#sec-{section} > summary")


def _close(page, section: str) -> None:
    if page.evaluate(f"document.getElementById('sec-{section}').open"):
        page.click(f"#sec-{section} > summary")


def _start_preset(page, tokenizer) -> list[int]:
    page.select_option("#att-preset", PRESET)
    ids = tokenizer.encode(PRESET)
    page.wait_for_function("(ids) => document.querySelector('#att-matrix').dataset.tokens === JSON.stringify(ids)",
                           arg=ids)
    return ids


def test_tokens_cost_and_letters(browser, live):
    server, served = live
    tokenizer = served.tokenizer
    page, errors = _page(browser, server)
    page.wait_for_selector("#tok-stats[data-tokens]")
    text = page.input_value("#tok-text")
    ids = tokenizer.encode(text, allow_special=False)
    pieces = page.locator("#tok-pieces .piece").evaluate_all("els => els.map(e => [Number(e.dataset.id), e.dataset.bytes])")
    assert pieces == [[p.id, p.bytes.hex(" ")] for p in tokenizer.pieces(ids)]
    rare = tokenizer.encode(" ophthalmologist")
    assert len(rare) > 1 and rare in _data(page, "#tok-split", "split")  # the rare word, split and highlighted
    split = page.locator("#tok-pieces .piece.split").evaluate_all("els => els.map(e => Number(e.dataset.id))")
    assert split == rare and "ophthalmologist" in page.inner_text("#tok-split")

    page.fill("#tok-price-in", "2.5")
    page.fill("#tok-price-out", "10")
    page.fill("#tok-output", "1234")
    page.wait_for_selector('#tok-stats[data-price-input="2.5"][data-price-output="10"][data-output-tokens="1234"]')
    route = httpx.post(server.url + "/explain/tokens", json={"text": text, "price_input": 2.5, "price_output": 10,
                                                              "output_tokens": 1234}).json()
    stats = page.locator("#tok-stats").evaluate("e => ({...e.dataset})")
    assert int(stats["tokens"]) == route["tokens"] == len(ids) and int(stats["characters"]) == len(text)
    for name, key in (("inputCost", "input_cost"), ("outputCost", "output_cost"), ("cost", "cost")):
        assert float(stats[name]) == pytest.approx(route[key], rel=1e-12)
    assert route["cost"] == pytest.approx(lesson.cost(len(ids), 2.5) + lesson.cost(1234, 10))
    assert f"together ${route['cost']:.3g}" in page.inner_text("#tok-stats")  # $0.0124 for 11 + 1234 tokens
    assert f"{len(text) / len(ids):.2f} characters per token" in page.inner_text("#tok-stats")

    page.fill("#tok-price-in", "5000")  # over the route's bound: its 400 shows on the section's line
    page.wait_for_function("document.getElementById('tok-error').textContent.includes('price_input')")
    errors[:] = [e for e in errors if "status of 400" not in e]  # the browser logs the refused request itself
    page.fill("#tok-price-in", "2.5")
    page.wait_for_function("document.getElementById('tok-error').textContent === ''")

    for word, letter, count in (("strawberry", "r", 3), ("ophthalmologist", "o", 3)):
        page.fill("#tok-word", word)
        page.fill("#tok-letter", letter)
        want = tokenizer.encode(" " + word)
        page.wait_for_function("([ids, n]) => { const d = document.getElementById('tok-letters').dataset; "
                               "return d.ids === JSON.stringify(ids) && d.count === String(n); }", arg=[want, count])
        assert _data(page, "#tok-letters", "letters") == len(word)
        assert f"{len(want)} number" in page.inner_text("#tok-letters")
    assert not errors, errors


def test_embeddings_map_and_positions(browser, live):
    server, served = live
    model, tokenizer = served.model, served.tokenizer
    page, errors = _page(browser, server)
    rows = lesson.embedding_rows(model, torch.arange(model.config.vocab_size))  # (vocab, hidden)
    _open(page, "embeddings")
    for word, k in (("king", 10), ("queen", 5)):
        page.fill("#emb-word", word)
        page.fill("#emb-k", str(k))
        ids, vector = lesson.word_vector(model, tokenizer, word)
        page.wait_for_function("([ids, k]) => document.getElementById('emb-facts').dataset.ids === JSON.stringify(ids) "
                               "&& document.querySelectorAll('#emb-neighbors tr[data-id]').length === k", arg=[ids, k])
        assert _data(page, "#emb-facts", "dimensions") == vector.shape[-1]
        assert _data(page, "#emb-vector", "values") == pytest.approx(vector[:16].tolist(), rel=1e-4, abs=1e-6)
        cosine = F.normalize(rows, dim=-1) @ F.normalize(vector, dim=-1)  # the oracle: a torch cosine top-k
        cosine[ids] = -torch.inf
        best = torch.topk(cosine, k)
        shown = page.locator("#emb-neighbors tr[data-id]").evaluate_all(
            "els => els.map(e => [Number(e.dataset.id), Number(e.dataset.cosine)])")
        assert [i for i, _ in shown] == best.indices.tolist()
        assert [c for _, c in shown] == pytest.approx(best.values.tolist(), abs=1e-4)

    words = [w.strip() for w in page.input_value("#emb-words").split(",")]
    page.wait_for_selector("#emb-map circle.point")
    vectors = torch.stack([lesson.word_vector(model, tokenizer, w)[1] for w in words])
    coords, share = lesson.pca_map(vectors)
    points = page.locator("#emb-map circle.point").evaluate_all(
        "els => els.map(e => [e.dataset.label, Number(e.dataset.x), Number(e.dataset.y)])")
    assert [p[0] for p in points] == words
    assert torch.tensor([p[1:] for p in points]) == pytest.approx(coords, abs=1e-4)
    assert _data(page, "#emb-explained", "explained") == pytest.approx(share, abs=1e-4)
    cosines = lesson.cosine_matrix(vectors)
    assert _cells(page, "#emb-cosine") == pytest.approx(cosines, abs=1e-4)
    others = cosines[0, 1:]
    compare = page.locator("#emb-compare").evaluate("e => ({...e.dataset})")
    assert compare["nearest"] == words[1 + int(others.argmax())] and compare["farthest"] == words[1 + int(others.argmin())]
    assert f"cosine({words[0]}, {compare['nearest']}) = {float(others.max()):.3f}" in page.inner_text("#emb-compare")
    page.fill("#emb-words", "apple, banana, king, queen")
    page.wait_for_function("document.querySelectorAll('#emb-map circle.point').length === 4")
    page.fill("#emb-words", "apple, banana")
    page.wait_for_function("document.getElementById('map-error').textContent.includes('3 to 40 words')")

    _open(page, "position")
    page.wait_for_selector("#pos-view[data-kind=rope] #pos-angles rect.cell")
    expected = lesson.positions(model, 64, 256)
    assert _cells(page, "#pos-angles") == pytest.approx(expected["angles"].T.float(), abs=1e-4)  # pairs x positions
    line = _data(page, "#pos-score path.series", "points")
    assert [x for x, _ in line] == list(range(257))
    assert [y for _, y in line] == pytest.approx(expected["score"].tolist(), abs=1e-4)
    page.fill("#pos-count", "16")
    pairs = len(expected["frequencies"])
    page.wait_for_function(f"document.querySelectorAll('#pos-angles rect.cell').length === {16 * pairs}")
    assert not errors, errors


def test_learned_positions(browser, learned_live):
    server, served = learned_live
    page, errors = _page(browser, server)
    _open(page, "position")
    page.wait_for_selector("#pos-view[data-kind=learned] #pos-similarity rect.cell")
    expected = lesson.positions(served.model, 64, 256)["similarity"].detach()
    assert _cells(page, "#pos-similarity") == pytest.approx(expected, abs=1e-4)
    assert page.is_hidden("#pos-distance-box")  # a learned table has no distance to set
    assert not errors, errors


def _check_detail(page, seen, layer: int, head: int, query: int) -> None:
    page.wait_for_selector(f'#att-detail[data-layer="{layer}"][data-head="{head}"][data-query="{query}"]')
    want = lesson.attention_detail(seen, layer, head, query)
    assert _data(page, "#att-detail", "q") == pytest.approx(want["q"][:8].tolist(), abs=1e-4)
    assert _data(page, "#att-detail", "output") == pytest.approx(want["output"][:8].tolist(), abs=1e-4)
    rows = page.locator("#att-scores tr[data-key]").evaluate_all(
        "els => els.map(e => [Number(e.dataset.key), Number(e.dataset.score), Number(e.dataset.weight), "
        "Number(e.dataset.modelWeight), JSON.parse(e.dataset.k)])")
    assert [r[0] for r in rows] == list(range(want["first"], query + 1))
    assert [r[1] for r in rows] == pytest.approx(want["scores"].tolist(), abs=1e-4)
    assert [r[2] for r in rows] == pytest.approx(want["weights"].tolist(), abs=1e-4)
    assert [r[3] for r in rows] == pytest.approx(seen.weights[layer, head, query, : query + 1].tolist(), abs=1e-4)
    assert torch.tensor([r[4] for r in rows]) == pytest.approx(want["keys"][:, :8], abs=1e-4)
    values = page.locator("#att-values tr[data-key]").evaluate_all("els => els.map(e => JSON.parse(e.dataset.v))")
    assert torch.tensor(values) == pytest.approx(want["values"][:, :8], abs=1e-4)


def _check_row(page, weights: torch.Tensor, query: int) -> None:
    page.wait_for_selector(f'#att-row[data-query="{query}"]')
    shown = page.locator("#att-row .att-key").evaluate_all("els => els.map(e => Number(e.dataset.weight))")
    assert shown == pytest.approx(weights[query, : query + 1].tolist(), abs=1e-4)


def test_attention_matrix_detail_and_presets(browser, live):
    server, served = live
    model, tokenizer = served.model, served.tokenizer
    page, errors = _page(browser, server)
    ids = _start_preset(page, tokenizer)  # a preset starts a session with its sentence, like Start
    key = _session_key(page)
    session = server.server.app.state.explainer.sessions[key].session
    assert session.prompt_ids == ids
    chips = page.locator("#tokens .chip.prompt").evaluate_all("els => els.map(e => Number(e.dataset.id))")
    assert chips == ids
    seen = lesson.inspect(model, ids)
    assert _cells(page, "#att-matrix") == pytest.approx(seen.weights[0].mean(0), abs=1e-4)  # layer 0, mean
    pronoun = ids.index(tokenizer.encode(" it")[0])
    _check_row(page, seen.weights[0].mean(0), pronoun)  # the preset opens on the pronoun's row
    _check_detail(page, seen, 0, 0, pronoun)  # the mean has no q: head 0 worked out

    page.select_option("#att-layer", "1")
    page.select_option("#att-head", "2")
    page.wait_for_selector('#att-matrix[data-layer="1"][data-head="2"]')
    assert _cells(page, "#att-matrix") == pytest.approx(seen.weights[1, 2], abs=1e-4)
    _check_detail(page, seen, 1, 2, pronoun)
    page.click('#att-matrix rect.cell[data-row="3"][data-col="1"]')  # a cell names its row
    _check_row(page, seen.weights[1, 2], 3)
    _check_detail(page, seen, 1, 2, 3)
    page.click('#att-matrix text.row-label[data-row="5"]')  # so does a token's label
    _check_row(page, seen.weights[1, 2], 5)
    _check_detail(page, seen, 1, 2, 5)

    for n in (1, 2):
        page.click("#step")
        page.wait_for_function(f"document.querySelectorAll('#tokens .chip.generated').length === {n}")
    node = _shown_node(page)
    page.wait_for_selector(f'#att-matrix[data-node="{node}"]')
    path = ids + session.path(node)  # the step's input: the prompt and the first generated token
    assert len(path) == len(ids) + 1 and _data(page, "#att-matrix", "tokens") == path
    assert page.locator("#attention .att").count() == len(path)  # the same keys as the last-position view
    assert _cells(page, "#att-matrix") == pytest.approx(lesson.inspect(model, path).weights[1, 2], abs=1e-4)
    _check_detail(page, lesson.inspect(model, path), 1, 2, 5)  # the chosen row stays chosen
    assert not errors, errors


def _check_lens(page, served, session, node: int) -> None:
    page.wait_for_selector(f'#lens-table[data-node="{node}"]')
    path = session.prompt_ids + session.path(node)
    want = lesson.lens(served.model, served.tokenizer, lesson.inspect(served.model, path), -1, 5)
    assert _data(page, "#lens-table", "final") == want["final"]["id"]
    assert _data(page, "#lens-table", "position") == len(path) - 1
    rows = page.locator("#lens-table tr[data-layer]").evaluate_all(
        "els => els.map(e => [Number(e.dataset.finalP), Number(e.dataset.finalRank), "
        "[...e.querySelectorAll('td.lens-cell')].map(c => [Number(c.dataset.id), Number(c.dataset.p)])])")
    assert len(rows) == len(want["layers"]) == served.model.config.num_hidden_layers + 1
    for (final_p, rank, top), layer in zip(rows, want["layers"], strict=True):
        assert final_p == pytest.approx(layer["final_p"], rel=1e-3) and rank == layer["final_rank"]
        assert [i for i, _ in top] == [t["id"] for t in layer["top"]]
        assert [p for _, p in top] == pytest.approx([t["p"] for t in layer["top"]], rel=1e-3)
    line = _data(page, "#lens-plot path.series", "points")
    assert [x for x, _ in line] == list(range(len(want["layers"])))
    assert [y for _, y in line] == pytest.approx([100 * layer["final_p"] for layer in want["layers"]], rel=1e-3)


def test_lens_follows_the_step_and_captures_wait_for_open_sections(browser, live):
    server, served = live
    page, errors = _page(browser, server)
    page.click("#start")
    page.wait_for_selector("#tokens .chip.prompt")
    key = _session_key(page)
    session = server.server.app.state.explainer.sessions[key].session
    _open(page, "layers")
    _check_lens(page, served, session, 0)  # before a step: what the first Step will read
    for n in (1, 2):
        page.click("#step")
        page.wait_for_function(f"document.querySelectorAll('#tokens .chip.generated').length === {n}")
    node = _shown_node(page)
    _check_lens(page, served, session, node)
    top = int(page.locator("#table tbody tr[data-id]").first.get_attribute("data-id"))
    assert _data(page, "#lens-table", "final") == top  # the lens's last layer is the table's top token

    page.wait_for_selector(f'#att-detail[data-node="{node}"]')  # the open attention section is done too
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if r.url.endswith(CAPTURES) else None)
    _close(page, "layers")
    _close(page, "attention")
    page.click("#step")
    page.wait_for_function("document.querySelectorAll('#tokens .chip.generated').length === 3")
    page.wait_for_timeout(300)
    assert requests == []  # an ordinary Step with the sections closed captures nothing
    _open(page, "layers")
    _check_lens(page, served, session, _shown_node(page))
    assert [url.rsplit("/", 1)[1] for url in requests] == ["lens"]
    page.click('#tree span[data-node="0"]')  # back at the prompt: the lens shows what Step will read there
    _check_lens(page, served, session, 0)
    assert not errors, errors


def test_sections_fit_400px(browser, live):
    server, served = live
    page, errors = _page(browser, server, width=400)
    _start_preset(page, served.tokenizer)
    for section in ("embeddings", "position", "layers"):
        _open(page, section)
    for selector in ("#tok-pieces .piece", "#tok-letters .piece", "#emb-neighbors tr[data-id]", "#emb-map circle",
                     "#emb-cosine rect.cell", "#pos-angles rect.cell", "#pos-score path", "#att-row .att-key",
                     "#att-scores tr[data-key]", "#lens-table tr[data-layer]"):
        page.wait_for_selector(selector)
    overflowing = """(root) => [...document.querySelectorAll(root)]
        .filter(e => !e.parentElement.closest('.scroll') && e.getBoundingClientRect().right > 400.5)
        .map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className.baseVal ?? e.className}`)"""
    mine = ", ".join(f"#lesson-{name}, #lesson-{name} *" for name in ("tokens", "embeddings", "position", "attention",
                                                                      "layers"))
    assert page.evaluate(overflowing, mine) == []  # these sections: wide tables scroll in their own box
    assert page.evaluate("document.documentElement.scrollWidth") <= 400, page.evaluate(overflowing, "body *")
    assert not errors, errors
