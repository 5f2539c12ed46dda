"""The explainer page in headless Chromium (Debian's /usr/bin/chromium, driven by Playwright)."""

from __future__ import annotations

import os
import shutil

import pytest

from live_server import LiveServer
from nexttok.server import create_app, load_served
from tiny_models import write_chat_model

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing in CI (scripts/setup.sh test installs Debian's chromium)")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory, gpt2_dir):
    directory = tmp_path_factory.mktemp("page_model")
    write_chat_model(directory, gpt2_dir)
    served = load_served(str(directory), "tiny")
    with LiveServer(create_app([served])) as server:
        yield server, served


def _set_dial(page, name: str, value: str) -> None:
    page.eval_on_selector(f"#{name}", "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }", value)


def test_explainer_page(browser, live, tmp_path):
    server, served = live
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.fill("#prompt", PROMPT)
    page.click("#start")
    page.wait_for_selector("#tokens .chip.prompt")

    ids = served.tokenizer.encode(PROMPT)
    chips = page.locator("#tokens .chip.prompt")
    assert chips.count() == len(ids)
    assert [int(chips.nth(i).get_attribute("data-id")) for i in range(len(ids))] == ids
    assert chips.nth(1).inner_text() == " capital"
    assert f"id {ids[1]}" in chips.nth(1).get_attribute("title") and "bytes 20 63" in chips.nth(1).get_attribute("title")

    for n in range(1, 4):
        page.click("#step")
        page.wait_for_function(f"document.querySelectorAll('#tokens .chip.generated').length === {n}")
    rows = page.locator("#table tbody tr:not(.rest)")
    assert rows.count() == 10
    assert page.locator("#table tbody tr.chosen").count() <= 1  # the pick may rank below 10th
    assert "everything else" in page.locator("#table tbody tr.rest").inner_text()
    assert "rank" in page.inner_text("#chosen") and "draw u" in page.inner_text("#chosen")
    assert page.locator("#stages li").count() == 6  # raw, top-k, top-p, min-p, temperature, draw
    assert "tokens/s" in page.inner_text("#timing")
    assert page.locator("#attention .att").count() == len(ids) + 2  # keys of the last step

    before = page.locator("#table .final-p").all_inner_texts()
    _set_dial(page, "temperature", "0.3")
    after = page.locator("#table .final-p").all_inner_texts()
    assert after != before  # re-drawn from the cached logits, no model call
    _set_dial(page, "top_k", "3")
    assert page.locator("#table tbody tr.cut").count() >= 7  # top-k 3 cuts all but three rows
    _set_dial(page, "top_k", "0")

    chosen_before = page.locator("#tokens .chip.generated").last.get_attribute("data-id")
    alternative = page.locator("#table tbody tr:not(.chosen):not(.rest)").first
    alt_id = alternative.get_attribute("data-id")
    assert alt_id != chosen_before
    alternative.click()
    page.wait_for_function(
        f"document.querySelector('#tokens .chip.generated:last-child').dataset.id === '{alt_id}'")
    assert page.locator("#tokens .chip.generated").count() == 3  # same depth, other branch
    assert int(page.get_attribute("#tree", "data-branches")) >= 1

    page.click("#step")
    page.wait_for_function("document.querySelectorAll('#tokens .chip.generated').length === 4")
    shot = tmp_path / "explainer.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert not errors, errors
