"""Section 4b of the explainer page, Mixture of experts, in headless Chromium: on tiny MoE checkpoints
the grid outlines, at every step, exactly the experts the step's JSON names, with their weights and
every expert's score, the text gives the model's own numbers (expert_facts), and at 400 px only the
grid scrolls; on the dense test model the section is one sentence and nothing else."""

from __future__ import annotations

import pytest

import test_page_early as page_early
from nexttok.lesson.experts import expert_facts
from test_lesson_experts import write_moe_checkpoint

DENSE = "This model is dense: each layer has one MLP that every token goes through (no router, no experts)."


@pytest.fixture(scope="module", params=["qwen3_moe", "glm4_moe"])
def moe_live(request, tmp_path_factory):
    """A live server over one tiny MoE checkpoint: qwen3_moe (softmax router, every layer sparse) or
    glm4_moe (sigmoid router in groups, a dense first layer, a shared expert)."""
    from live_server import LiveServer
    from nexttok.server import create_app, load_served

    directory = tmp_path_factory.mktemp(f"page_{request.param}")
    write_moe_checkpoint(request.param, directory)
    served = load_served(str(directory), request.param)
    with LiveServer(create_app([served])) as server:
        yield server, served


def _page(browser, server, width: int = 1280):
    page, errors = page_early._page(browser, server, width)  # the page loaded, its errors collected
    page.fill("#prompt", "the router picks")
    page.click("#start")
    page.wait_for_selector("#tokens .chip.prompt")
    page.wait_for_selector("#moe-kind[data-kind]", state="attached")
    return page, errors


def _step(page) -> dict:
    """Press Step; the step's JSON once the grid shows its node."""
    with page.expect_response(lambda r: r.url.endswith("/step")) as answer:
        page.click("#step")
    view = answer.value.json()
    page.wait_for_selector(f'#moe-grid[data-node="{view["node"]}"]')
    return view


def _grid(page) -> dict[int, dict]:
    """The grid as shown: per layer row, its chosen experts (expert -> weight, and the label) and
    every cell's score; a dense layer's row has no cells."""
    return {row["layer"]: row for row in page.locator("#moe-grid tr[data-layer]").evaluate_all("""rows => rows.map(
        r => ({layer: Number(r.dataset.layer), dense: r.classList.contains('dense'),
               chosen: [...r.querySelectorAll('td.chosen')].map(
                 td => [Number(td.dataset.expert), Number(td.dataset.weight), td.textContent]),
               probs: [...r.querySelectorAll('td[data-expert]')].map(td => Number(td.dataset.p))}))""")}


def test_the_grid_outlines_the_experts_each_step_chose(browser, moe_live):
    server, served = moe_live
    config, facts = served.model.config, expert_facts(served.model)
    e, k = config.num_experts, config.num_experts_per_tok
    page, errors = _page(browser, server)
    assert page.get_attribute("#moe-kind", "data-kind") == "moe"
    assert page.evaluate("document.getElementById('sec-experts').open")
    speed = page.inner_text("#moe-speed")
    assert f"reads {k} of {e} experts: {round(100 * k / e, 2):g}% of the expert weights per token" in speed
    assert int(page.get_attribute("#moe-speed", "data-total")) == facts.total
    assert int(page.get_attribute("#moe-speed", "data-active")) == facts.active
    assert page.locator("#moe-grid tr").count() == 0  # no step yet
    for _ in range(3):
        view = _step(page)
        grid = _grid(page)
        assert sorted(grid) == list(range(config.num_hidden_layers))
        routed = {r["layer"]: r for r in view["experts"]}
        assert [layer for layer, row in grid.items() if row["dense"]] == \
            [i for i, kind in enumerate(config.mlp_types) if kind == "dense"]
        for layer, r in routed.items():
            row = grid[layer]
            assert [c[0] for c in sorted(row["chosen"])] == sorted(r["ids"])  # the outlined cells: the step's ids
            weights = dict(zip(r["ids"], r["weights"], strict=True))
            assert all(w == weights[i] and label == f"{weights[i]:.2f}" for i, w, label in row["chosen"])
            assert row["probs"] == r["probs"]  # every expert's score shades its cell
        assert f"Step {view['step']['index'] + 1}: the router's choice" in page.inner_text("#moe-caption")
    # each grid is the one of its step (_step waits for the grid tagged with the step's node) and equals
    # that step's JSON; whether the choice changes between steps is the random model's business (a tiny
    # model repeating one token may route it the same way three times)
    page.click('#tree span[data-node="0"]')  # back at the prompt: no step shown, no grid
    page.wait_for_function("document.querySelectorAll('#moe-grid tr').length === 0")
    assert not errors, errors


def test_the_section_fits_400px(browser, moe_live):
    server, _ = moe_live
    page, errors = _page(browser, server, width=400)
    _step(page)
    overflowing = """() => [...document.querySelectorAll('#lesson-experts, #lesson-experts *, #sec-experts > summary *')]
        .filter(e => !e.parentElement.closest('.scroll') && e.getBoundingClientRect().right > 400.5)
        .map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className}`)"""
    assert page.evaluate(overflowing) == []  # the grid scrolls in its own box
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    assert not errors, errors


def test_a_dense_models_section_is_one_sentence(browser, tiny_live):
    server, _ = tiny_live
    page, errors = _page(browser, server)
    assert page.get_attribute("#moe-kind", "data-kind") == "dense"
    assert not page.evaluate("document.getElementById('sec-experts').open")  # it stays folded, as it was
    page.click("#sec-experts > summary")
    page.click("#step")
    page.wait_for_function("document.querySelectorAll('#tokens .chip.generated').length === 1")
    page.wait_for_timeout(200)
    assert page.inner_text("#lesson-experts").strip() == DENSE  # and nothing else: no grid, no numbers
    assert page.locator("#moe-grid tr").count() == 0
    assert not errors, errors
