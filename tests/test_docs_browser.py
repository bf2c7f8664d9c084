"""The site as a reader sees it: built, served and opened in headless Chromium.

`mkdocs build --strict` catches broken links, not what a page looks like. This
module builds the site into a temporary folder, serves it on 127.0.0.1 and
opens every page of docs/ in headless Chromium (driven over the DevTools
protocol, `tests/_browser.py`), then asserts in the rendered page:

- no `**` and no `::: ` in the text outside code (Markdown that did not
  render: `2**-126` turned bold, a raw mkdocstrings directive);
- every ```python block of the page's source is on the page, highlighted
  (its tokens drawn in more than one colour);
- no line of a code block is cut off: each block is as wide as its content;
- no label of the navigation or table of contents is truncated;
- every image loaded;
- site search, given `get_scaled_loss`, lists the API reference.

Chromium: Debian's `chromium` package (`apt-get install chromium`); CI
installs it (`.ci/run`), and the test extra installs mkdocs. Where either is
missing the tests skip, except under CI (`CI=true`), where they fail. `DOCS_SCREENSHOTS=DIR` also writes a
screenshot of each page's first screen to DIR.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, Iterator, List

import _browser
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(p.relative_to(ROOT / "docs").as_posix()
               for p in (ROOT / "docs").glob("**/*.md"))
PYTHON_FENCE = re.compile(r"^(`{3,}|~{3,})python\s*$", re.M)

pytestmark = pytest.mark.slow


def url_path(page: str) -> str:
    """Where mkdocs puts a page: `index.md` -> ``, `api.md` -> `api/`."""
    stem = page[:-len(".md")]
    if stem == "index":
        return ""
    return (stem[:-len("/index")] if stem.endswith("/index") else stem) + "/"


def _missing(message: str) -> None:
    """Skips where a tool is missing; fails under CI, which must run it."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI must run the browser check")
    pytest.skip(message)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None:
        _missing("mkdocs is not installed (the test extra installs it)")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
         str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def base_url(site) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[_browser.Browser]:
    executable = _browser.find_chromium()
    if executable is None:
        _missing("no Chromium on PATH: apt-get install chromium (Debian)")
    with _browser.Browser(executable) as b:
        yield b


# One probe of the rendered page, in the page: what a reader would see.
PROBE = r"""(() => {
  const article = document.querySelector("article.md-content__inner");
  const prose = article.cloneNode(true);
  prose.querySelectorAll("pre, code, .highlight").forEach(e => e.remove());
  const text = prose.textContent;
  const strays = [];
  for (const marker of ["**", "::: "]) {
    let i = text.indexOf(marker);
    while (i !== -1 && strays.length < 5) {
      strays.push(text.slice(Math.max(0, i - 40), i + 40).replace(/\s+/g, " "));
      i = text.indexOf(marker, i + 1);
    }
  }
  const python = [...article.querySelectorAll("div.language-python.highlight")];
  const unhighlighted = python.filter(block => {
    const code = block.querySelector("pre > code");
    const colours = new Set([...code.querySelectorAll("span")]
      .filter(s => s.textContent.trim())
      .map(s => getComputedStyle(s).color));
    return colours.size < 2;
  }).map(block => block.textContent.slice(0, 60));
  const cut = [...article.querySelectorAll("pre > code")]
    .filter(c => c.scrollWidth > c.clientWidth + 1)
    .map(c => [c.scrollWidth, c.clientWidth, c.textContent.slice(0, 60)]);
  const truncated = [...document.querySelectorAll(
      ".md-nav__link, .md-nav__link .md-ellipsis")]
    .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
    .map(e => e.textContent.trim());
  const images = [...article.querySelectorAll("img")];
  return {
    title: document.title,
    strays: strays,
    python: python.length,
    unhighlighted: unhighlighted,
    cut: cut,
    truncated: truncated,
    images: images.length,
    broken_images: images.filter(i => !i.complete || i.naturalWidth === 0)
      .map(i => i.src),
  };
})()"""


def python_fences(page: str) -> int:
    return len(PYTHON_FENCE.findall(
        (ROOT / "docs" / page).read_text(encoding="utf-8")))


def test_every_page_is_checked():
    assert {"index.md", "api.md", "errors.md", "performance.md"} <= set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_cleanly(page, base_url, browser):
    browser.open(base_url + url_path(page))
    seen: Dict[str, object] = browser.evaluate(PROBE)
    shots = os.environ.get("DOCS_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        browser.screenshot(Path(shots) / (page.replace("/", "_") + ".png"))
    assert seen["title"].endswith("tf_lossscale"), seen["title"]
    assert seen["strays"] == [], f"unrendered Markdown on {page}"
    # Each ```python block, and each signature an API directive renders.
    source = (ROOT / "docs" / page).read_text(encoding="utf-8")
    expected = python_fences(page) + len(re.findall(r"^::: ", source, re.M))
    assert seen["python"] >= expected, (
        f"{page}: {expected} python blocks and signatures in the source, "
        f"{seen['python']} python blocks on the page")
    assert seen["unhighlighted"] == []
    assert seen["cut"] == [], f"code lines cut off on {page}"
    assert seen["truncated"] == [], f"truncated labels on {page}"
    assert seen["broken_images"] == []


def test_first_page_shows_its_picture(base_url, browser):
    browser.open(base_url)
    size: List[int] = browser.evaluate(
        "(() => { const i = document.querySelector('article img');"
        " return [i.naturalWidth, i.getBoundingClientRect().width]; })()")
    assert size[0] > 600 and size[1] > 400, size


def test_search_finds_get_scaled_loss(base_url, browser):
    browser.open(base_url + "?q=get_scaled_loss")
    count = browser.wait_for(
        "document.querySelectorAll('.md-search-result__item').length")
    assert count >= 3
    meta = browser.evaluate(
        "document.querySelector('.md-search-result__meta').textContent")
    assert re.fullmatch(r"\d+ matching documents?", meta.strip()), meta
    links = browser.evaluate(
        "[...document.querySelectorAll('.md-search-result__link')]"
        ".map(a => new URL(a.href).pathname)")
    assert any(link.startswith("/api/") for link in links), links
