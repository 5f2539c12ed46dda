"""Write the README's pictures of the explainer page on the default model, after a few steps:
docs/explainer.png (the whole page, every section open) and docs/lesson-*.png (sections), and
check that at 400 px nothing is wider than the screen.

    .venv/bin/python scripts/explainer_screenshot.py [docs]

Needs Debian's chromium (apt-get install chromium) and the test extras (playwright).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from playwright.sync_api import sync_playwright  # noqa: E402

from live_server import LiveServer  # noqa: E402
from nexttok.checkpoints.bundled import DEFAULT_MODEL  # noqa: E402
from nexttok.server import create_app, load_served  # noqa: E402

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


FIRST = {"sec-attention": "attention", "sec-layers": "lens"}  # shot after the first step (" Paris")
LATER = {"sec-tokens": "tokens", "sec-sampling": "draw", "sec-loop": "loop"}  # after four steps


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    served = load_served(DEFAULT_MODEL)
    with LiveServer(create_app([served])) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
        for width in (1280, 400):
            page = browser.new_page(viewport={"width": width, "height": 1000})
            start(page, server.url)
            steps(page, 1)
            shoot(page, out, FIRST, width)
            steps(page, 3)
            shoot(page, out, LATER, width)
            if width == 400:
                wide = page.evaluate("document.documentElement.scrollWidth")
                print(f"at 400 px the page is {wide} px wide" + ("" if wide <= 400 else "  <-- too wide"))
            else:
                page.screenshot(path=str(out / "explainer.png"), full_page=True)
        browser.close()
    print(f"wrote {out}/explainer.png and {', '.join(f'lesson-{n}.png' for n in {**FIRST, **LATER}.values())}")


def start(page, url: str) -> None:
    """The usual prompt with top-p 0.9, every section open; the prompt box not sticky (it would
    cover the sections' pictures)."""
    page.goto(url + "/")
    page.add_style_tag(content="#prompt-box { position: static !important; }")
    page.fill("#prompt", "The capital of France is")
    page.wait_for_selector("#dials[data-ready] #top_p")  # the dials' ranges come from the server
    page.eval_on_selector("#top_p", "el => { el.value = '0.9'; el.dispatchEvent(new Event('input')); }")
    page.click("#start")
    page.wait_for_selector("#tokens .chip")
    page.evaluate("document.querySelectorAll('details.lesson').forEach(d => { d.open = true; })")


def steps(page, count: int) -> None:
    done = page.locator("#tokens .chip.generated").count()
    for n in range(done + 1, done + count + 1):
        page.click("#step")
        page.wait_for_function(f"document.querySelectorAll('#tokens .chip.generated').length === {n}")
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(1500)


def shoot(page, out: Path, sections: dict[str, str], width: int) -> None:
    if width != 1280:
        return
    for section, name in sections.items():
        page.locator(f"#{section}").screenshot(path=str(out / f"lesson-{name}.png"))


if __name__ == "__main__":
    main()
