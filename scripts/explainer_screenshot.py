"""Write docs/explainer.png: the explainer page on the default model, after a few steps.

    .venv/bin/python scripts/explainer_screenshot.py [out.png]

Needs Debian's chromium (apt-get install chromium) and the test extras (playwright).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from playwright.sync_api import sync_playwright  # noqa: E402

from live_server import LiveServer  # noqa: E402
from nexttok.bundled import DEFAULT_MODEL  # noqa: E402
from nexttok.server import create_app, load_served  # noqa: E402

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/explainer.png")
    served = load_served(DEFAULT_MODEL)
    with LiveServer(create_app([served])) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(server.url + "/")
        page.fill("#prompt", "The capital of France is")
        page.wait_for_selector("#dials[data-ready] #top_p")  # the dials' ranges come from the server
        page.eval_on_selector("#top_p", "el => { el.value = '0.9'; el.dispatchEvent(new Event('input')); }")
        page.click("#start")
        page.wait_for_selector("#tokens .chip")
        for n in range(1, 4):
            page.click("#step")
            page.wait_for_function(f"document.querySelectorAll('#tokens .chip.generated').length === {n}")
        page.select_option("#layer", "12")
        page.screenshot(path=str(out), full_page=True)
        browser.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
