"""The live view (`meshrl ui`) and report.html in a real headless browser: Debian's chromium driven
by Playwright (never Playwright's own browser download). The run's page loads, updates while the
job runs (its step and state change on screen), and a screenshot is not blank; the finished run's
report.html loads with its plots drawn."""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements-dev)")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (`make system-deps` installs it)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


def _not_blank(png: bytes, min_colors: int = 8) -> bool:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20) or []
    return len(colors) >= min_colors and image.getbbox() is not None


def test_live_page_updates_while_the_job_runs(browser, submitted, tmp_path):
    name = Path(submitted["job"].run_dir).name
    page = browser.new_page(viewport={"width": 1100, "height": 800})
    page.goto(f"{submitted['liveview'].url}/run/{name}")
    page.wait_for_selector("#run:not([hidden])", timeout=30_000)
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        shown = (page.inner_text("#state"), page.inner_text("#step"))
        if not seen or seen[-1] != shown:
            seen.append(shown)
        if shown[0] in ("SUCCEEDED", "FAILED"):
            break
        time.sleep(0.5)
    assert seen[-1] == ("SUCCEEDED", "2"), seen
    # live: the open page went from RUNNING to the end by itself (both steps may land within one 1 s poll)
    assert len(seen) >= 2 and seen[0][0] == "RUNNING", f"no live updates: {seen}"
    page.wait_for_timeout(1500)  # one more poll after the end
    nodes = {row.get_attribute("data-node"): row.get_attribute("class") for row in page.query_selector_all("#nodes tr")}
    assert {"rollout", "actor_train"} <= set(nodes) and set(nodes.values()) == {"COMPLETED"}, nodes
    assert page.query_selector_all("#curves polyline") and page.query_selector_all("#waterfall rect")
    assert page.query_selector_all("#signal polyline")  # zero-variance groups and entropy (issue 41)
    assert page.inner_text("#weights") not in ("", "-")
    shot = page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    assert _not_blank(shot)
    page.goto(submitted["liveview"].url + "/")
    page.wait_for_selector(f"#runs a[href='/run/{name}']", timeout=10_000)
    page.close()


def test_report_html_renders_its_plots(browser, observed, tmp_path):
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.goto((observed["run_dir"] / "report.html").as_uri())
    assert observed["run_dir"].name in page.inner_text("h1")
    widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert len(widths) == 2 and all(w > 100 for w in widths), widths
    assert _not_blank(page.screenshot(path=str(tmp_path / "report.png"), full_page=True))
    page.close()
