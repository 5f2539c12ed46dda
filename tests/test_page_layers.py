"""Layer types on the explainer page, in headless Chromium, on tiny random checkpoints of a hybrid
(LFM2: convolutions around one attention layer), a sliding-window model (Gemma 3: local, global,
local) and a plain one (Qwen2): the layer menus name each layer by its own index and type; section 4
draws each attention layer's own matrix (HF's attentions of that layer), marks a sliding layer's
window edge (keys older than the window greyed, with no weight) and shows a recurrent layer's state
size instead of a matrix; the last-position view follows the same labels; section 8 shows the
bytes generation's cache holds per layer type (KVCache.held_bytes() after that many tokens) now and
at the model's context, beside a cache of every layer full, and says why that keeps long texts
cheap; at 400 px nothing runs off the page."""

from __future__ import annotations

import pytest
import torch

import test_page_early as page_early
from nexttok.generation.prefill import prefill
from nexttok.models.cache import KVCache
from test_lesson_layers import write_layered_checkpoint
from tiny_models import random_ids

PROMPT = "the quick brown fox jumps over the lazy dog"
KINDS = {"full_attention": "full attention", "sliding_attention": "sliding window", "conv": "convolution"}


@pytest.fixture(scope="module", params=["lfm2", "gemma3", "qwen2"])
def layered(request, tmp_path_factory):
    """A live server over one tiny checkpoint; its ServedModel and HF model."""
    from live_server import LiveServer
    from nexttok.server import create_app, load_served

    directory = tmp_path_factory.mktemp(f"page_{request.param}")
    hf = write_layered_checkpoint(request.param, directory)
    served = load_served(str(directory), request.param)
    with LiveServer(create_app([served])) as server:
        yield server, served, hf


def _page(browser, server, width: int = 1280):
    page, errors = page_early._page(browser, server, width)
    page.fill("#prompt", PROMPT)
    page.click("#start")
    page.wait_for_selector("#tokens .chip.prompt")
    page.wait_for_selector("#att-matrix[data-kind]", state="attached")
    return page, errors


def _step(page) -> dict:
    """Press Step; the step's JSON once the page shows it."""
    with page.expect_response(lambda r: r.url.endswith("/step")) as answer:
        page.click("#step")
    view = answer.value.json()
    page.wait_for_selector(f'#table[data-node="{view["node"]}"]')
    page.wait_for_selector(f'#cache-types tr[data-type="total"][data-now="{view["cache"]["held"]["total"]}"]')
    return view


def _hf_attentions(hf, ids: list[int]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [a[0] for a in hf(torch.tensor([ids]), output_attentions=True).attentions]


def _label(config, layer: int) -> str:
    kind = config.layer_types[layer]
    return f"{layer} · {KINDS[kind]}" + (f" {config.sliding_window}" if kind == "sliding_attention" else "")


def test_each_layer_shows_what_it_keeps(browser, layered):
    """Section 4, layer by layer: the menu's labels; an attention layer's matrix is HF's attention of
    that layer (the mean of its heads), with the window's edge on a sliding layer; a recurrent layer
    draws no matrix and says what it keeps. Then the last-position view after a step, likewise."""
    server, served, hf = layered
    config = served.model.config
    page, errors = _page(browser, server)
    options = page.locator("#att-layer option").evaluate_all("os => os.map(o => [o.value, o.textContent])")
    assert options == [[str(i), _label(config, i)] for i in range(config.num_hidden_layers)]
    ids = page_early._data(page, "#att-matrix", "tokens")
    reference = _hf_attentions(hf, ids)
    for layer, kind in enumerate(config.layer_types):
        page.select_option("#att-layer", str(layer))
        page.wait_for_selector(f'#att-matrix[data-layer="{layer}"]', state="attached")
        page.wait_for_selector(f'#att-kind[data-layer="{layer}"]', state="attached")
        assert page.get_attribute("#att-matrix", "data-kind") == kind
        text = page.inner_text("#att-kind")
        if layer in config.recurrent_layers:
            assert page.locator("#att-matrix rect.cell").count() == 0 and page.locator("#att-row .piece").count() == 0
            numbers = config.hidden_size * (config.conv_kernel - 1)
            assert f"Layer {layer}: convolution layer: keeps the last {config.conv_kernel - 1} inputs, {numbers} " \
                   "numbers, the same at any length." in text
            assert int(page.get_attribute("#att-kind", "data-numbers")) == numbers
            continue
        want = reference[config.attention_layers.index(layer)].mean(0)
        assert page_early._cells(page, "#att-matrix") == pytest.approx(want, abs=1e-4)
        edge = page.locator("#att-matrix path.window-edge")
        if kind == "sliding_attention":
            window = config.sliding_window
            assert len(ids) > window and edge.count() == 1 and edge.get_attribute("data-window") == str(window)
            assert page.text_content("#att-matrix text.window-label") == f"window {window}"
            assert f"Layer {layer}: sliding window, window {window}." in text
            outside = page.locator("#att-matrix rect.cell.outside").evaluate_all(
                "els => els.map(e => [Number(e.dataset.row), Number(e.dataset.col), Number(e.dataset.value)])")
            assert sorted((i, j) for i, j, _ in outside) == \
                [(i, j) for i in range(len(ids)) for j in range(len(ids)) if j <= i - window]
            assert all(v == 0 for _, _, v in outside)  # older than the window: no weight
        else:
            assert edge.count() == 0 and page.locator("#att-matrix rect.cell.outside").count() == 0
            assert f"Layer {layer}: full attention." in text
    view = _step(page)
    _check_last_position(page, config, view)
    assert not errors, errors


def _check_last_position(page, config, view: dict) -> None:
    """The step's view of the last position (#layer): the same labels; each attention layer's
    weights are the step's entry for that layer, keys older than a window marked; a recurrent layer
    says it has no attention."""
    options = page.locator("#layer option").evaluate_all("os => os.map(o => [o.value, o.textContent])")
    assert options == [[str(i), _label(config, i)] for i in range(config.num_hidden_layers)]
    assert page.input_value("#layer") == str(config.attention_layers[0])  # it starts on a layer that attends
    for layer, kind in enumerate(config.layer_types):
        page.select_option("#layer", str(layer))
        page.wait_for_selector(f'#attention[data-layer="{layer}"]', state="attached")
        if layer in config.recurrent_layers:
            assert page.locator("#attention .att").count() == 0
            assert page.inner_text("#attention .att-state").startswith(f"Layer {layer} has no attention: it is a "
                                                                       "convolution layer: keeps the last")
            continue
        entry = view["attention_layers"].index(layer)
        weights = page.locator("#attention .att").evaluate_all("els => els.map(e => Number(e.dataset.weight))")
        assert weights == pytest.approx(view["attention_mean"][entry], abs=1e-6)
        outside = page.locator("#attention .att.outside").count()
        if kind == "sliding_attention":
            assert outside == len(weights) - config.sliding_window
            assert page.inner_text("#attention .window-edge") == f"| window {config.sliding_window} →"
        else:
            assert outside == 0 and page.locator("#attention .window-edge").count() == 0


def test_the_cache_section_holds_bytes_per_layer_type(browser, layered):
    """Section 8 after two steps: a row per layer type the model has, each with the bytes of
    generation's cache (KVCache.held_bytes() once that many tokens are in) now and at the model's
    context; the total; a cache of every layer full; the summary and why it matters, in words."""
    server, served, _ = layered
    model, config = served.model, served.model.config
    page, errors = _page(browser, server)
    _step(page)
    view = _step(page)
    held, long = view["cache"]["held"], view["cache"]["full_context"]
    rows = {r["type"]: r for r in page.locator("#cache-types tr[data-type]").evaluate_all(
        "rs => rs.map(r => ({...r.dataset, cells: [...r.cells].map(c => c.textContent)}))")}
    types = [t for t, present in (("full", "full_attention" in config.layer_types),
                                  ("sliding", "sliding_attention" in config.layer_types),
                                  ("recurrent", bool(config.recurrent_layers))) if present]
    assert list(rows) == [*types, "total", "all_full"]
    for tokens, numbers, field in ((held["tokens"], held, "now"), (long["tokens"], long, "fullContext")):
        cache = KVCache.for_model(config, max_len=tokens, windowed=True)
        prefill(model, cache, random_ids(tokens, seed=tokens)[0].tolist())
        measured = cache.held_bytes()
        for t in types:
            assert int(rows[t][field]) == numbers[t] == measured[t], (t, tokens)
        assert int(rows["total"][field]) == sum(measured.values())
        assert int(rows["all_full"][field]) == numbers["all_full"] == \
            config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4 * tokens
    assert held["tokens"] == view["cache"]["tokens"] and long["tokens"] == config.max_position_embeddings
    layers_of = {"full": [i for i, k in enumerate(config.layer_types) if k == "full_attention"],
                 "sliding": [i for i, k in enumerate(config.layer_types) if k == "sliding_attention"],
                 "recurrent": config.recurrent_layers}
    for t in types:
        assert rows[t]["cells"][1] == ", ".join(map(str, layers_of[t]))
    if "sliding" in rows:
        assert rows["sliding"]["cells"][0] == f"sliding window {config.sliding_window}"
        assert rows["sliding"]["cells"][2].startswith(f"the last {config.sliding_window} tokens' keys and values")
    if "recurrent" in rows:
        assert rows["recurrent"]["cells"][2] == \
            f"the last 2 inputs, {config.hidden_size * 2} numbers, the same at any length"
    summary = page.inner_text("#cache-summary")
    if types == ["full"]:
        assert summary.startswith("Every layer of this model is full attention")
    else:
        share = round(100 * long["total"] / long["all_full"])
        assert share < 100 and f"{share}% at its whole context of {long['tokens']} tokens" in summary
        keeps_all = "Its sliding layers still keep every token: the text is not yet longer than their window"
        assert (keeps_all in summary) == (0 < held["sliding_slots"] == held["tokens"])  # 30 tokens < 5 + room
    why = page.inner_text("#cache-why")
    assert "grows in step with the text" in why and "stops growing" in why and "Hybrid models" in why
    assert not errors, errors


def test_the_layer_views_fit_400px(browser, layered):
    server, served, _ = layered
    page, errors = _page(browser, server, width=400)
    _step(page)
    page.select_option("#att-layer", str(served.model.config.num_hidden_layers - 1))
    page.wait_for_selector(f'#att-kind[data-layer="{served.model.config.num_hidden_layers - 1}"]', state="attached")
    overflowing = """() => [...document.querySelectorAll('#att-kind, #att-kind *, #attention *, #lesson-loop *')]
        .filter(e => !e.closest('.scroll') && e.getBoundingClientRect().right > 400.5)
        .map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className}`)"""
    assert page.evaluate(overflowing) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    assert not errors, errors
