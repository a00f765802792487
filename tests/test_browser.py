"""A real browser on the built site: Debian's headless Chromium, driven through chromedriver.

Opens the landing page, the guide and one example page of a strict build (test preset) served on
localhost, and checks that every image loads with a non-zero size, that every internal link and
anchor resolves, that the browser console has no errors, and that the dark-mode toggle changes the
page. At a phone's 412x915 and a desktop's 1400x900 it checks that figures enlarge on a click or
tap, that a table wider than its column scrolls in a container that says so, that code blocks
scroll instead of wrapping, and (desktop) that the page's sidebar shows every section.
Screenshots go to ``_build/screenshots/`` of the repository.

``MPGUIDE_BROWSER_SITE=<folder with index.html>`` serves an existing build instead of making one
(for work on ``docs/_static``: copy the changed files into that build's ``_static``).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.build]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PAGES = [
    "index.html",
    "model/manual_optimization.html",
    "verification.html",
    "releases.html",
    "gpu_references.html",
    "auto_examples/plot_02_two_optimizers.html",
]
#: The guide's budget (issue 25, raised from issue 19's 20 screens for readable figures and the round-4
#: answers): screen heights at 1400x900, words of rendered text, and the screens its symptom list must end in.
GUIDE_MAX_SCREENS, GUIDE_MAX_WORDS, SYMPTOMS_WITHIN_SCREENS, SCREEN = 24, 5000, 2, (1400, 900)
SHOTS = ROOT / "_build" / "screenshots"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def server(request):
    prebuilt = os.environ.get("MPGUIDE_BROWSER_SITE")
    if prebuilt:
        html = Path(prebuilt)
        if not (html / "index.html").is_file():
            pytest.fail(f"MPGUIDE_BROWSER_SITE={prebuilt}: no index.html there; point it at a build's html folder")
    else:
        out, _ = request.getfixturevalue("built_site")
        html = out / "html"
    handler = functools.partial(_QuietHandler, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", html
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail(
            "Chromium and chromedriver are needed for the browser test: apt-get install chromium "
            "chromium-driver (nox -s tests installs them when it runs as root)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
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
        "return Array.from(document.images).map(i => [i.currentSrc, i.complete, i.naturalWidth, i.naturalHeight])"
    )
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
            "return [document.documentElement.dataset.theme, getComputedStyle(document.body).backgroundColor]"
        )

    before = state()
    toggle = next(b for b in browser.find_elements("css selector", ".theme-switch-button") if b.is_displayed())
    toggle.click()
    dark = next(
        b for b in browser.find_elements("css selector", ".theme-change-button[data-mode='dark']") if b.is_displayed()
    )
    dark.click()
    after = state()
    assert before[0] == "light" and after[0] == "dark", (before, after)
    assert before[1] != after[1], f"background did not change: {before[1]} -> {after[1]}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "manual_optimization_dark.png"))


# --------------------------------------------------------------------- phone and desktop
VIEWPORTS = {"phone": (412, 915), "desktop": (1400, 900)}
GUIDE, EXAMPLE = "model/manual_optimization.html", "auto_examples/plot_06_accumulation.html"
#: Figures of the pages: sphinx-gallery's images and the guide's executed cells.
FIGURES_JS = "Array.from(document.querySelectorAll('.bd-article img')).filter(i => !i.closest('a'))"


def _open(browser, page_url: str, viewport: str) -> None:
    width, height = VIEWPORTS[viewport]
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": viewport == "phone"},
    )
    browser.get(page_url)
    browser.execute_script("localStorage.setItem('mode', 'light'); window.scrollTo(0, 0);")


@pytest.fixture
def viewport(browser, request):
    yield request.param
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@pytest.mark.parametrize("viewport", list(VIEWPORTS), indirect=True)
@pytest.mark.parametrize("page", [GUIDE, EXAMPLE])
def test_figures_enlarge_on_click_or_tap(server, browser, page, viewport):
    """A click (a tap on a phone) on each figure shows it larger; on a phone at least at its own size,
    where its 10 pt legend is 15 px tall; Escape closes it."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    base, _ = server
    _open(browser, base + page, viewport)
    figures = browser.execute_script(f"return {FIGURES_JS}.filter(i => i.naturalWidth > 300);")
    assert len(figures) >= 2, f"{page}: expected figures, found {len(figures)}"
    for img in figures[:4]:
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", img)
        inline, natural, src = browser.execute_script(
            "const r = arguments[0].getBoundingClientRect(); return [r.width, arguments[0].naturalWidth, "
            "arguments[0].currentSrc];",
            img,
        )
        ActionChains(browser).move_to_element(img).click().perform()
        shown = browser.execute_script(
            "const [src, img] = arguments; return Array.from(document.images).filter(i => i !== img && "
            "i.currentSrc === src && i.getBoundingClientRect().width > 0).map(i => i.getBoundingClientRect().width);",
            src,
            img,
        )
        assert shown, f"{page} at {viewport}: a click on {src.rsplit('/', 1)[-1]} shows no enlarged figure"
        assert max(shown) > inline * 1.2, (
            f"{page} at {viewport}: the enlarged figure is {max(shown):.0f} px wide, the inline one {inline:.0f} px"
        )
        if viewport == "phone":
            assert max(shown) >= natural - 1, f"on a phone the figure must show at its own size ({natural} px)"
            # it opens at its middle (matplotlib centres the title) and the close button stays off the title
            middle, close_top = browser.execute_script(
                "const box = document.querySelector('.mpguide-lightbox'); const b = box.querySelector('button');"
                "return [Math.abs(box.scrollLeft - (box.scrollWidth - box.clientWidth) / 2),"
                " b.getBoundingClientRect().top];"
            )
            assert middle <= 1, f"{page}: the enlarged figure opens {middle:.0f} px away from its middle"
            assert close_top > VIEWPORTS["phone"][1] / 2, f"{page}: the close button is at {close_top:.0f} px, not low"
        ActionChains(browser).send_keys(Keys.ESCAPE).perform()
        left = browser.execute_script(
            "const [src, img] = arguments; return Array.from(document.images).filter(i => i !== img && "
            "i.currentSrc === src && i.getBoundingClientRect().width > 0).length;",
            src,
            img,
        )
        assert left == 0, "Escape does not close the enlarged figure"
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", figures[0])
    browser.save_screenshot(str(SHOTS / f"{page.replace('/', '_').replace('.html', '')}_{viewport}_figure.png"))


_TABLES_JS = """
const out = [];
for (const table of document.querySelectorAll('.bd-article table')) {
  let box = table.parentElement, scroller = null;
  while (box && !box.classList.contains('bd-article')) {
    const o = getComputedStyle(box).overflowX;
    if ((o === 'auto' || o === 'scroll') && !scroller) scroller = box;
    box = box.parentElement;
  }
  const column = document.querySelector('.bd-article').getBoundingClientRect().width;
  const width = table.getBoundingClientRect().width;
  if (width <= column + 1 && (!scroller || scroller.scrollWidth <= scroller.clientWidth + 1)) continue;
  const cue = scroller ? getComputedStyle(scroller, '::before').content : 'none';
  out.push({width: width, column: column, scroller: !!scroller,
            scrolls: scroller ? scroller.scrollWidth > scroller.clientWidth : false, cue: cue,
            text: table.innerText.slice(0, 60)});
}
return out;
"""


@pytest.mark.parametrize("viewport", ["phone"], indirect=True)  # at 1400 px no table of the guide is too wide
def test_wide_tables_scroll_in_a_container_that_says_so(server, browser, viewport):
    """No table is wider than the column unless it sits in a scroll container with a visible hint."""
    base, _ = server
    _open(browser, base + GUIDE, viewport)
    browser.execute_script("window.dispatchEvent(new Event('resize'));")
    wide = browser.execute_script(_TABLES_JS)
    bad = [t for t in wide if not (t["scroller"] and t["scrolls"] and "scroll" in t["cue"])]
    assert not bad, (
        f"{len(bad)} of {len(wide)} wide tables at {viewport} lack a scroll container with a hint: {bad[:3]}"
    )
    assert wide, "at 412 px some tables of the guide are wider than the column (else this test checks nothing)"
    browser.execute_script(
        "arguments[0].scrollIntoView({block: 'center'});", browser.find_elements("css selector", ".mpguide-wide")[0]
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "manual_optimization_phone_table.png"))


@pytest.mark.parametrize("viewport", list(VIEWPORTS), indirect=True)
@pytest.mark.parametrize("page", [GUIDE, EXAMPLE])
def test_code_blocks_scroll_sideways_instead_of_wrapping(server, browser, page, viewport):
    """Wrapped Python breaks its indentation: every code block keeps its lines and scrolls (captured output wraps:
    test_code_never_wraps_and_captured_output_does)."""
    base, _ = server
    _open(browser, base + page, viewport)
    styles = browser.execute_script(
        "return Array.from(document.querySelectorAll('.bd-article pre'))"
        ".filter(p => !p.closest('.sphx-glr-script-out, .cell_output'))"
        ".map(p => [getComputedStyle(p).whiteSpace, getComputedStyle(p).overflowX, p.scrollWidth > p.clientWidth]);"
    )
    assert styles, f"{page} has no code block"
    bad = [s for s in styles if s[0] != "pre" or s[1] not in ("auto", "scroll")]
    assert not bad, f"{len(bad)} of {len(styles)} code blocks wrap or cannot scroll: {bad[:3]}"
    if viewport == "phone" and page == GUIDE:
        # issue 25: the guide's snippets fit a phone (comments above the line), so none scrolls sideways
        wide = [i for i, s in enumerate(styles) if s[2]]
        assert not wide, f"at 412 px {len(wide)} of {len(styles)} guide code blocks scroll sideways: {wide}"
    elif viewport == "phone":
        assert any(s[2] for s in styles), "at 412 px some code line is longer than the block (else nothing is checked)"


def test_the_sidebar_shows_every_section_of_the_guide(server, browser):
    """At 1400x900 every section of the guide is listed inside the visible part of the sidebar, at the
    top of the page and at its end (the highlighted entry stays in view as the page scrolls)."""
    base, _ = server
    _open(browser, base + GUIDE, "desktop")
    try:

        def hidden():
            return browser.execute_script("""
                const bar = document.querySelector('.bd-sidebar-secondary').getBoundingClientRect();
                const bottom = Math.min(bar.bottom, window.innerHeight), top = Math.max(bar.top, 0);
                const top_level = document.querySelectorAll('#pst-page-toc-nav > ul > li > a, ' +
                  '#pst-page-toc-nav > ul > li > ul > li > a');
                return Array.from(top_level).filter(a => {
                  const r = a.getBoundingClientRect();
                  return r.height > 0 && (r.top < top - 1 || r.bottom > bottom + 1);
                }).map(a => a.textContent.trim().slice(0, 50));""")

        sections = browser.execute_script("return document.querySelectorAll('.bd-article section > h2').length;")
        assert sections >= 5, "the guide should have sections"
        assert not hidden(), f"sections listed below the visible sidebar at the top of the page: {hidden()}"
        import time

        # read down to the last section as a reader would, in steps the theme's scroll observer sees
        last = browser.execute_script(
            "const h = Array.from(document.querySelectorAll('.bd-article section > h2')).pop();"
            "return h.getBoundingClientRect().top + window.scrollY;"
        )
        for y in range(0, int(last) + 1, 700):
            browser.execute_script("window.scrollTo({top: arguments[0], behavior: 'instant'});", y)
            time.sleep(0.05)
        browser.execute_script("window.scrollTo({top: arguments[0] - 100, behavior: 'instant'});", last)
        time.sleep(1.0)  # the theme's observer marks the entry, then mpguide.js scrolls the sidebar
        active = browser.execute_script("""
            const a = Array.from(document.querySelectorAll('#pst-page-toc-nav a.active')).pop();
            if (!a) return null;
            const bar = document.querySelector('.bd-sidebar-secondary').getBoundingClientRect();
            const r = a.getBoundingClientRect();
            return [a.textContent.trim(), r.top >= Math.max(bar.top, 0) - 1 && r.bottom <= Math.min(bar.bottom,
                    window.innerHeight) + 1];""")
        assert active and active[1], f"at the end of the page the highlighted section is out of view: {active}"
        SHOTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SHOTS / "manual_optimization_desktop_end.png"))
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def measure(browser, url: str) -> tuple[float, int]:
    """``(screen heights, words)`` of a page at :data:`SCREEN`: the document's scroll height over the
    screen's height (900 px, as the issues' budgets are measured by ``shared/tools/page_metrics.py``; the
    window's ``innerHeight`` is smaller by the headless browser's own bars), and the words of the
    article's text, collapsed ``<details>`` included (``textContent`` counts hidden text too)."""
    browser.set_window_size(*SCREEN)
    browser.get(url)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    inner = SCREEN[1]
    text = browser.execute_script(  # every text node, hidden ones included, joined by spaces
        "const main = document.querySelector('article') || document.querySelector('main') || document.body;"
        "const walk = document.createTreeWalker(main, NodeFilter.SHOW_TEXT); const parts = [];"
        "while (walk.nextNode()) parts.push(walk.currentNode.nodeValue); return parts.join(' ');"
    )
    return height / inner, len(text.split())


def test_the_guide_fits_its_budget(server, browser):
    """At most 24 screen heights at 1400x900 and 5,000 words, the symptom list ending within the first two
    screens: the guide teaches, the evidence is elsewhere."""
    base, _ = server
    screens, words = measure(browser, base + "model/manual_optimization.html")
    symptoms_end = browser.execute_script(
        "const s = document.getElementById('symptoms') || document.getElementById('find-your-symptom');"
        "const items = s ? s.querySelectorAll('li') : [];"
        "return items.length ? items[items.length - 1].getBoundingClientRect().bottom + window.scrollY : null;"
    )
    assert symptoms_end is not None, "the guide has no symptom list (section id 'symptoms')"
    assert symptoms_end <= SYMPTOMS_WITHIN_SCREENS * SCREEN[1], (
        f"the symptom list ends at {symptoms_end:.0f} px, below the first {SYMPTOMS_WITHIN_SCREENS} screens"
    )
    print(f"guide: {screens:.1f} screens at {SCREEN[0]}x{SCREEN[1]}, {words} words")
    assert screens <= GUIDE_MAX_SCREENS, (
        f"the guide is {screens:.1f} screens high at 1400x900 (at most {GUIDE_MAX_SCREENS})"
    )
    assert words <= GUIDE_MAX_WORDS, f"the guide has {words} words (at most {GUIDE_MAX_WORDS})"


def test_the_budget_measure_fails_on_a_long_page(server, browser, tmp_path):
    """The measure itself: a page of 30 screens of text is over budget, in height and in words."""
    base, root = server
    long_page = root / "_budget_probe.html"
    long_page.write_text(
        "<html><body><article>"
        + "<p>word word word word word</p>" * 2000
        + "<details><summary>s</summary>"
        + "hidden " * 5000
        + "</details></article></body></html>"
    )
    try:
        screens, words = measure(browser, base + "_budget_probe.html")
    finally:
        long_page.unlink()
    assert screens > GUIDE_MAX_SCREENS and words > GUIDE_MAX_WORDS, (screens, words)
    assert words >= 15000  # the collapsed block's words are counted


#: The examples' budget (issue 28): every gallery page at most 10 screens at 1400x900, and its call to copy (the
#: first code block holding ``Trainer(`` and ``.fit(``, or ``Fabric(`` and ``backward(``) starting within the
#: first 3 screens, measured as ``shared/tools/example_pages.py`` measures them.
EXAMPLE_MAX_SCREENS, COPY_WITHIN_SCREENS = 10, 3
_COPY_BLOCK = """
const pre = [...document.querySelectorAll('article pre, .bd-article pre, pre')].find(e => {
  const t = e.innerText;
  return (t.includes('Trainer(') && t.includes('.fit(')) || (t.includes('Fabric(') && t.includes('backward('));
});
return pre ? pre.getBoundingClientRect().top + window.scrollY : null;"""


def measure_example(browser, url: str) -> tuple[float, float | None]:
    """``(screen heights, top of the call to copy in px)`` of a gallery page at :data:`SCREEN` (``None``: no
    block holds a call to copy)."""
    screens, _ = measure(browser, url)
    return screens, browser.execute_script(_COPY_BLOCK)


def test_every_example_page_fits_its_budget(server, browser):
    base, html = server
    pages = sorted((html / "auto_examples").glob("plot_*.html"))
    assert len(pages) >= 18, f"expected the 18 gallery pages, found {len(pages)}"
    problems = []
    for page in pages:
        screens, copy_top = measure_example(browser, f"{base}auto_examples/{page.name}")
        print(f"{page.stem}: {screens:.1f} screens, call to copy at {copy_top} px")
        if screens > EXAMPLE_MAX_SCREENS:
            problems.append(
                f"{page.stem}: {screens:.1f} screens at 1400x900 (at most {EXAMPLE_MAX_SCREENS}); fold more of its "
                "verification into its Evidence cells, or split it in two lessons"
            )
        if copy_top is None or copy_top >= COPY_WITHIN_SCREENS * SCREEN[1]:
            problems.append(
                f"{page.stem}: the call to copy starts at {copy_top} px, not within the first {COPY_WITHIN_SCREENS} "
                f"screens ({COPY_WITHIN_SCREENS * SCREEN[1]} px); move the Trainer(...).fit(...) cell up"
            )
    assert not problems, "\n".join(problems)


def test_the_example_measure_fails_on_a_late_call_to_copy(server, browser):
    """The measure itself: a page whose only Trainer(...).fit(...) block sits below 4 screens of text, and a
    12-screen page, break the budget."""
    base, root = server
    probe = root / "_example_probe.html"
    probe.write_text(
        "<html><body><article>"
        + '<p style="margin:0;height:900px">screen</p>' * 4
        + "<pre>trainer = pl.Trainer(max_steps=5)\ntrainer.fit(model)</pre>"
        + '<p style="margin:0;height:900px">screen</p>' * 8
        + "</article></body></html>"
    )
    try:
        screens, copy_top = measure_example(browser, base + "_example_probe.html")
    finally:
        probe.unlink()
    assert screens > EXAMPLE_MAX_SCREENS, screens
    assert copy_top is not None and copy_top >= COPY_WITHIN_SCREENS * SCREEN[1], copy_top


# --------------------------------------------------------------- gallery code that fits (issue 36)
#: Gallery blocks (code and captured output) that may scroll sideways with every fold open, as a share of all of
#: them (issue 36: 0 at 1400 px, at most 10 % at 412 px). The reader's cells are formatted at 46 columns
#: (``mpguide_build.gallery_format``; a long block of them is set in two columns on a desktop, mpguide.js), the
#: Evidence cells at 118, which is what still scrolls on a phone; captured output wraps (mpguide.css, checked
#: below: code never does). Before: 34 of 205 at 1400 px and 179 of 205 at 412 px (2026-12-04); 20 of 219 and
#: 114 of 219 (2026-12-05, before the install commands, the output wrap and the shorter statements).
GALLERY_SCROLL_LIMITS = {"desktop": 0.0, "phone": 0.10}
_SCROLLING_BLOCKS = """
for (const d of document.querySelectorAll('details')) d.open = true;
const blocks = Array.from(document.querySelectorAll('.bd-article div.highlight pre, .bd-article pre.literal-block'));
return [blocks.length, blocks.filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.innerText.split('\\n')
  .reduce((a, b) => (b.length > a.length ? b : a), '').slice(0, 60))];"""


def scrolling_blocks(browser, url: str, viewport: str) -> tuple[int, list[str]]:
    """``(code blocks, the longest line of each block that scrolls sideways)`` of a page at ``viewport``, with
    every ``<details>`` fold opened (the Evidence cells' code counts)."""
    _open(browser, url, viewport)
    total, wide = browser.execute_script(_SCROLLING_BLOCKS)
    return total, wide


@pytest.mark.parametrize("viewport", list(VIEWPORTS), indirect=True)
def test_gallery_code_fits_its_column(server, browser, viewport):
    base, html = server
    pages = sorted((html / "auto_examples").glob("plot_*.html"))
    assert len(pages) >= 18, f"expected the 18 gallery pages, found {len(pages)}"
    total = 0
    wide: list[str] = []
    for page in pages:
        blocks, scrolling = scrolling_blocks(browser, f"{base}auto_examples/{page.name}", viewport)
        total += blocks
        wide += [f"{page.stem}: {line}" for line in scrolling]
    print(f"{viewport}: {len(wide)} of {total} gallery code blocks scroll sideways")
    limit = GALLERY_SCROLL_LIMITS[viewport]
    assert len(wide) <= limit * total, (
        f"at {VIEWPORTS[viewport][0]} px {len(wide)} of {total} gallery code blocks scroll sideways (at most "
        f"{limit:.0%}); shorten the lines below (python -m mpguide_build.gallery_format examples/plot_NN_*.py "
        "formats them and names what it cannot split):\n" + "\n".join(wide[:20])
    )


_WRAPPING = """
const code = Array.from(document.querySelectorAll('.bd-article div.highlight pre, .bd-article pre.literal-block'))
  .filter(p => !p.closest('.sphx-glr-script-out, .cell_output'));
const out = Array.from(document.querySelectorAll('.bd-article .sphx-glr-script-out pre, .bd-article .cell_output pre'));
const ws = p => getComputedStyle(p).whiteSpace;
return [code.length, code.filter(p => ws(p) !== 'pre').length,
  out.length, out.filter(p => ws(p) !== 'pre-wrap').length];"""


@pytest.mark.parametrize("viewport", ["phone"], indirect=True)
def test_code_never_wraps_and_captured_output_does(server, browser, viewport):
    """The scroll measure above must not be met by wrapping code: every code block of an example page and of the
    guide keeps ``white-space: pre`` (Python's indentation and the copied text stay as written), and what a run
    printed wraps at the column's edge, as a terminal shows it."""
    base, html = server
    pages = [f"auto_examples/{p.name}" for p in sorted((html / "auto_examples").glob("plot_*.html"))] + [GUIDE]
    code = outputs = 0
    for page in pages:
        _open(browser, base + page, viewport)
        blocks, wrapped, printed, unwrapped = browser.execute_script(_WRAPPING)
        assert not wrapped, f"{page}: {wrapped} of {blocks} code blocks wrap (mpguide.css must keep code on its lines)"
        assert not unwrapped, f"{page}: {unwrapped} of {printed} output blocks do not wrap"
        code, outputs = code + blocks, outputs + printed
    assert code > 100 and outputs > 20, (code, outputs)


@contextlib.contextmanager
def _article_probe(root: Path, name: str, body: str):
    """A page ``name`` in the served folder with the site's stylesheet and ``body`` in its article; yields its
    path relative to the server's root and removes it afterwards."""
    probe = root / name
    probe.write_text(
        '<html><head><link rel="stylesheet" href="_static/mpguide.css"></head><body><div class="bd-article">'
        f"{body}</div></body></html>"
    )
    try:
        yield name
    finally:
        probe.unlink()


@pytest.mark.parametrize("viewport", ["phone"], indirect=True)
def test_the_wrapping_measure_counts_wrapped_code(server, browser, viewport):
    """The measure itself: a code block set to wrap, and an output block set not to, are both counted."""
    base, root = server
    body = (
        '<div class="highlight"><pre style="white-space: pre-wrap">x = 1</pre></div>'
        '<div class="highlight"><pre>y = 2</pre></div>'
        '<div class="sphx-glr-script-out"><div class="highlight"><pre style="white-space: pre">out</pre></div></div>'
    )
    with _article_probe(root, "_wrap_probe.html", body) as page:
        _open(browser, base + page, viewport)
        counts = browser.execute_script(_WRAPPING)
    assert counts == [2, 1, 1, 1], counts


@pytest.mark.parametrize("viewport", ["desktop"], indirect=True)
def test_the_scroll_measure_counts_a_block_that_scrolls(server, browser, viewport):
    """The measure itself: one block with a 200-character line inside a closed fold scrolls and is counted."""
    base, root = server
    body = (
        '<div class="highlight"><pre>short = 1</pre></div><details><summary>s</summary><div class="highlight">'
        f"<pre>long = '{'x' * 200}'</pre></div></details>"
    )
    with _article_probe(root, "_scroll_probe.html", body) as page:
        total, wide = scrolling_blocks(browser, base + page, viewport)
    assert total == 2 and len(wide) == 1 and wide[0].startswith("long = 'x"), (total, wide)


@pytest.mark.parametrize("viewport", list(VIEWPORTS), indirect=True)
def test_long_narrow_gallery_code_reads_in_two_columns_on_a_desktop(server, browser, viewport):
    """mpguide.js: a 31-line block of 46-column code is set in two columns at 1400 px, the second starting at
    the top-level line after its middle blank line, and in one on a phone; a block with one 100-character line,
    a short block and a block in a fold stay in one; every block's text (what the copy button copies) is kept."""
    base, root = server
    probe = root / "_columns_probe.html"
    rows = [f"    value_{i:02d} = compute(alpha, beta, gamma) + {i}" for i in range(30)]
    narrow = "\n".join(["def first():", *rows[:14], "", "def second():", *rows[14:]])
    wide = narrow + "\n" + "x" * 100
    short = "\n".join(narrow.splitlines()[:5])
    block = '<div class="highlight-Python"><div class="highlight"><pre>{}</pre></div></div>'
    probe.write_text(
        '<html><head><meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="stylesheet" href="_static/mpguide.css"><script src="_static/mpguide.js"></script>'
        '</head><body><div class="bd-article"><div class="sphx-glr-example-title"></div>'
        + block.format(narrow)
        + block.format(wide)
        + block.format(short)
        + "<details><summary>s</summary>"
        + block.format(narrow)
        + "</details></div></body></html>"
    )
    try:
        _open(browser, base + "_columns_probe.html", viewport)
        columns, texts, second = browser.execute_script(
            "const pres = [...document.querySelectorAll('.bd-article pre')];"
            "const mark = pres[0].querySelector('.mpguide-column-break');"
            "return [pres.map(p => getComputedStyle(p).columnCount), pres.map(p => p.textContent),"
            " mark ? mark.nextSibling.textContent.split('\\n')[0] : null];"
        )
    finally:
        probe.unlink()
    assert columns == (["2", "auto", "auto", "auto"] if viewport == "desktop" else ["auto"] * 4), columns
    assert texts == [narrow, wide, short, narrow]
    assert second == ("def second():" if viewport == "desktop" else None), second


@pytest.mark.parametrize("viewport", ["phone"], indirect=True)
def test_figures_drawn_small_say_they_enlarge(server, browser, viewport):
    """A 1400 px figure drawn in a phone's column gets the hint line; a small one does not (mpguide.js)."""
    base, root = server
    probe, wide = root / "_zoom_probe.html", root / "_zoom_probe.svg"
    wide.write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="1400" height="350"><rect width="1400" height="350"/></svg>'
    )
    probe.write_text(
        '<html><head><script src="_static/mpguide.js"></script></head><body><div class="bd-article">'
        '<img class="align-center" src="_zoom_probe.svg" style="max-width:100%">'
        '<img class="align-center" src="_zoom_probe.svg" style="width:1400px"></div></body></html>'
    )
    try:
        _open(browser, base + "_zoom_probe.html", viewport)
        browser.execute_script("return new Promise(r => setTimeout(r, 300));")
        hints = browser.execute_script(
            "return [...document.querySelectorAll('.bd-article img')].map(i => !!(i.nextElementSibling && "
            "i.nextElementSibling.classList.contains('mpguide-zoom-hint')));"
        )
    finally:
        probe.unlink()
        wide.unlink()
    assert hints == [True, False], hints


@pytest.mark.parametrize("viewport", ["phone"], indirect=True)
def test_the_front_page_reads_on_a_phone(server, browser, viewport):
    """At 412x915 the guide link is on the first screen and no table is wider than the column."""
    base, _ = server
    _open(browser, base + "index.html", viewport)
    top, tables, column = browser.execute_script(
        "const a = document.querySelector('.bd-article');"
        "const g = [...a.querySelectorAll('a')]"
        ".find(x => (x.getAttribute('href') || '').includes('manual_optimization'));"
        "return [g ? g.getBoundingClientRect().top + scrollY : null,"
        " [...a.querySelectorAll('table')].map(t => t.getBoundingClientRect().width), a.getBoundingClientRect().width];"
    )
    assert top is not None and top < VIEWPORTS["phone"][1], f"the guide link starts at {top} px"
    assert all(w <= column + 1 for w in tables), f"tables {tables} in a {column} px column"


@pytest.mark.parametrize("viewport", ["desktop"], indirect=True)
def test_the_release_summary_fits_one_screen(server, browser, viewport):
    base, _ = server
    _open(browser, base + "releases.html", viewport)
    height = browser.execute_script(
        "const s = document.getElementById('release-pitfalls'); const t = s && s.querySelector('table');"
        "return t ? t.getBoundingClientRect().bottom - s.getBoundingClientRect().top : null;"
    )
    assert height is not None and height <= VIEWPORTS["desktop"][1], f"the summary is {height} px tall"


def symptom_messages() -> list[str]:
    """The bold opening of each bullet of the guide's "Find your symptom" list, as a reader would type it."""
    import re

    text = (ROOT / "docs" / "model" / "manual_optimization.md").read_text()
    section = text[text.index("(symptoms)=") : text.index("\n## ", text.index("(symptoms)=") + 20)]
    return [re.sub(r"[`*]", "", m).strip().rstrip(".") for m in re.findall(r"^\* \*\*(.+?)\*\*", section, re.M)]


def search_rank(browser, base: str, query: str, page: str) -> tuple[int | None, list[str]]:
    """Rank of ``page`` among the distinct pages the site's own search lists for ``query`` (1 = first)."""
    import time
    from urllib.parse import quote

    browser.get(base + "search.html?q=" + quote(query))
    for _ in range(120):
        if browser.execute_script(
            "const s = document.querySelector('.search-summary');"
            "return !!s && !/Preparing|Searching/.test(s.textContent);"
        ):
            break
        time.sleep(0.25)
    hrefs = browser.execute_script(
        "return [...document.querySelectorAll('ul.search li > a')].map(a => a.getAttribute('href'));"
    )
    pages = list(dict.fromkeys(h.split("#")[0].split("?")[0] for h in hrefs))
    return next((i + 1 for i, p in enumerate(pages) if page in p), None), pages


@pytest.mark.parametrize("viewport", ["desktop"], indirect=True)
def test_search_finds_the_guide_first_for_every_symptom(server, browser, viewport):
    base, _ = server
    messages = symptom_messages()
    assert len(messages) >= 10, messages
    ranks = {m: search_rank(browser, base, m, "model/manual_optimization") for m in messages}
    for m, (rank, pages) in ranks.items():
        print(f"{rank}\t{len(pages)}\t{m}")
    late = {m: (rank, pages[:3]) for m, (rank, pages) in ranks.items() if rank != 1}
    assert not late, f"the guide is not the first result for: {late}"
