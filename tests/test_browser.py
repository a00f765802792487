"""A real browser on the built site: Debian's headless Chromium, driven through chromedriver.

Opens the landing page, the guide and one example page of a strict build (test preset) served on
localhost, and checks that every image loads with a non-zero size, that every internal link and
anchor resolves, that the browser console has no errors, and that the dark-mode toggle changes the
page. Screenshots go to ``_build/screenshots/`` of the repository.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PAGES = ["index.html", "model/manual_optimization.html", "verification.html", "releases.html", "gpu_references.html",
         "auto_examples/plot_02_two_optimizers.html"]
#: The guide's budget (issue 19): screen heights at 1400x900, and words of rendered text.
GUIDE_MAX_SCREENS, GUIDE_MAX_WORDS, SCREEN = 20, 9000, (1400, 900)
SHOTS = ROOT / "_build" / "screenshots"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - keep the test output readable
        pass


@pytest.fixture(scope="module")
def server(built_site):
    out, _ = built_site
    handler = functools.partial(_QuietHandler, directory=str(out / "html"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", out / "html"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("Chromium and chromedriver are needed for the browser test: apt-get install chromium "
                    "chromium-driver (nox -s tests installs them when it runs as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.mark.parametrize("page", PAGES)
def test_page_images_links_and_console(server, browser, page):
    base, root = server
    browser.get(base + page)
    browser.get_log("browser")  # drop messages of earlier pages
    browser.refresh()
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.currentSrc, i.complete, i.naturalWidth, i.naturalHeight])")
    assert images or page in ("releases.html", "verification.html"), f"{page} shows no image"
    broken = [src for src, complete, w, h in images if not (complete and w > 0 and h > 0)]
    assert not broken, f"{page}: images that did not load: {broken}"
    if page not in ("index.html", "releases.html", "verification.html"):
        assert any("sphx_glr" in src or "jupyter_execute" in src or "_images" in src for src, *_ in images)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"{page}: console errors: {errors}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / (page.replace("/", "_").replace(".html", "") + ".png")))


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def test_every_internal_link_and_anchor_resolves(server):
    """All pages of the built site: each relative link names an existing file and, if it has one, an id."""
    _, root = server
    parsed = {p: _parse(p) for p in root.rglob("*.html")}
    missing = []
    for page, links in parsed.items():
        for href in links.hrefs:
            url = urlparse(href)
            if url.scheme or href.startswith(("mailto:", "javascript:", "//")):
                continue  # external links cannot be reached from these machines
            target = (page.parent / url.path).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                missing.append(f"{page.relative_to(root)} -> {href}")
            elif url.fragment and target.suffix == ".html" and url.fragment not in parsed[target].ids:
                missing.append(f"{page.relative_to(root)} -> {href} (no such anchor)")
    assert len(parsed) > 10
    assert not missing, "broken internal links:\n" + "\n".join(missing[:30])


def test_dark_mode_toggle_changes_the_page(server, browser):
    """Open the theme's colour-mode menu and choose Dark, as a reader would."""
    base, _ = server
    browser.get(base + "model/manual_optimization.html")
    browser.execute_script("localStorage.setItem('mode', 'light');")
    browser.refresh()

    def state():
        return browser.execute_script(
            "return [document.documentElement.dataset.theme, getComputedStyle(document.body).backgroundColor]")

    before = state()
    toggle = next(b for b in browser.find_elements("css selector", ".theme-switch-button") if b.is_displayed())
    toggle.click()
    dark = next(b for b in browser.find_elements("css selector", ".theme-change-button[data-mode='dark']")
                if b.is_displayed())
    dark.click()
    after = state()
    assert before[0] == "light" and after[0] == "dark", (before, after)
    assert before[1] != after[1], f"background did not change: {before[1]} -> {after[1]}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "manual_optimization_dark.png"))


def measure(browser, url: str) -> tuple[float, int]:
    """``(screen heights, words)`` of a page at :data:`SCREEN`: the document's scroll height over the
    window's inner height, and the words of the article's text, collapsed ``<details>`` included
    (``textContent`` counts hidden text too)."""
    browser.set_window_size(*SCREEN)
    browser.get(url)
    height, inner = browser.execute_script(
        "return [document.documentElement.scrollHeight, window.innerHeight]")
    text = browser.execute_script(  # every text node, hidden ones included, joined by spaces
        "const main = document.querySelector('article') || document.querySelector('main') || document.body;"
        "const walk = document.createTreeWalker(main, NodeFilter.SHOW_TEXT); const parts = [];"
        "while (walk.nextNode()) parts.push(walk.currentNode.nodeValue); return parts.join(' ');")
    return height / inner, len(text.split())


def test_the_guide_fits_its_budget(server, browser):
    """At most 20 screen heights at 1400x900 and 9,000 words: the guide teaches, the evidence is elsewhere."""
    base, _ = server
    screens, words = measure(browser, base + "model/manual_optimization.html")
    print(f"guide: {screens:.1f} screens at {SCREEN[0]}x{SCREEN[1]}, {words} words")
    assert screens <= GUIDE_MAX_SCREENS, f"the guide is {screens:.1f} screens high at 1400x900 (at most {GUIDE_MAX_SCREENS})"
    assert words <= GUIDE_MAX_WORDS, f"the guide has {words} words (at most {GUIDE_MAX_WORDS})"


def test_the_budget_measure_fails_on_a_long_page(server, browser, tmp_path):
    """The measure itself: a page of 30 screens of text is over budget, in height and in words."""
    base, root = server
    long_page = root / "_budget_probe.html"
    long_page.write_text("<html><body><article>" + "<p>word word word word word</p>" * 2000
                         + "<details><summary>s</summary>" + "hidden " * 5000 + "</details></article></body></html>")
    try:
        screens, words = measure(browser, base + "_budget_probe.html")
    finally:
        long_page.unlink()
    assert screens > GUIDE_MAX_SCREENS and words > GUIDE_MAX_WORDS, (screens, words)
    assert words >= 15000  # the collapsed block's words are counted
