"""The built site: it builds with warnings as errors, its internal links and anchors resolve, and it renders.

CI builds the site once (``tools/dev/test_tf_version.sh --docs``, the README's
build command) and names the directory in ``DOCS_SITE_DIR``; elsewhere, where
the ``docs`` extra is installed, the site is built here into a temporary
directory. Without either, these tests skip: the docs extra needs Python
3.11 or newer, and CI's Python 3.10 leg runs without it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_pages  # noqa: E402

BROWSER_PAGES = ["index.html", "tf2.html", "api.html"]  # the landing page, a training page, the API


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if os.environ.get("DOCS_SITE_DIR"):
        return Path(os.environ["DOCS_SITE_DIR"])
    if any(importlib.util.find_spec(name) is None for name in ("sphinx", "myst_parser", "furo")):
        pytest.skip("the docs extra is not installed (pip install '.[docs]', Python 3.11 or newer)")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                            str(doc_pages.DOCS), str(out)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    return out


class _Page(HTMLParser):
    """The ids a page defines and the links (href, src) it holds."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value:
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_every_page_of_the_docs_is_built(site):
    built = {path.stem for path in site.glob("*.html")}
    assert {page.stem for page in doc_pages.DOCS.glob("*.md")} <= built


def test_internal_links_and_anchors_resolve(site):
    pages = {path: _parse(path) for path in site.rglob("*.html")}
    broken = []
    checked = 0
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            checked += 1
            if not target.exists():
                broken.append(f"{path.relative_to(site)}: {link} (no file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(site)}: {link} (no id {parts.fragment!r})")
    assert checked > 500
    assert not broken, "\n".join(broken)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="needs a headless chromium")
@pytest.mark.parametrize("name", BROWSER_PAGES)
def test_page_renders_in_a_browser_without_script_errors(site, name):
    with tempfile.TemporaryDirectory() as profile:
        run = subprocess.run(
            [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom",
             (site / name).as_uri()],
            capture_output=True, text=True, timeout=120)
    main = re.search(r'<article role="main"[^>]*>(.*?)</article>', run.stdout, re.S)
    assert main, run.stdout[-2000:] + run.stderr[-2000:]
    text = re.sub(r"<[^>]+>", " ", main.group(1))
    assert len(text.split()) > 150, text[:500]
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line]
    errors = [line for line in console if "Uncaught" in line or "Failed to load" in line or ":ERROR:CONSOLE" in line]
    assert not errors, "\n".join(errors)
