"""The documentation as data: its pages, marked examples, links, headings and tables.

The pages are ``README.md`` and ``docs/*.md``. A code block that the tests
run is marked by an HTML comment on the line before its fence (invisible on
GitHub and in the built site)::

    <!-- example: runs -->
    ```sh
    amp-rewrite tools/example/mlp.pb mlp_amp.pb
    ```

and a block right after it marked ``<!-- example: prints -->`` holds lines
that must appear in what the example printed.
"""

from __future__ import annotations

import importlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

RUNS = "<!-- example: runs -->"
PRINTS = "<!-- example: prints -->"
FENCE = re.compile(r"^\s*(`{3,})(\S*).*$")
LINK = re.compile(r"(?<!!)\[(?:[^\]]|\][^(])*?\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")


def pages() -> list[Path]:
    """The README and every Markdown page of the site."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """A fenced code block: the page, the line its fence opens on, its language, its text."""

    page: Path
    line: int
    language: str
    code: str
    marker: str  # the example marker on the line before the fence, or ""


@dataclass(frozen=True)
class Example:
    """A marked example and the lines it must print."""

    block: Block
    prints: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.block.page.relative_to(REPO)}:{self.block.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced code block of ``page``, in order."""
    found = []
    lines = page.read_text().split("\n")
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, language = opening.groups()
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == fence)
        before = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = before if before in (RUNS, PRINTS) else ""
        found.append(Block(page, index + 1, language, "\n".join(lines[index + 1:end]) + "\n", marker))
        index = end + 1
    return found


def examples() -> list[Example]:
    """The marked examples of every page."""
    found = []
    for page in pages():
        page_blocks = blocks(page)
        for block, following in itertools.zip_longest(page_blocks, page_blocks[1:]):
            if block.marker != RUNS:
                continue
            prints = ()
            if following is not None and following.marker == PRINTS:
                prints = tuple(line for line in following.code.split("\n") if line.strip())
            found.append(Example(block, prints))
    return found


def prose(page: Path) -> str:
    """The page's text outside fenced code blocks."""
    text = page.read_text()
    for block in blocks(page):
        text = text.replace(block.code, "\n")
    return text


def headings(page: Path) -> list[str]:
    """The titles of the page's headings, outside code blocks."""
    return [m.group(2) for m in map(HEADING.match, prose(page).split("\n")) if m]


def slug(title: str) -> str:
    """A heading's anchor, as MyST (``myst_heading_anchors``) and GitHub make it."""
    title = title.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def links(page: Path) -> list[str]:
    """The targets of the page's Markdown links, outside code blocks."""
    return LINK.findall(prose(page))


def expand_braces(text: str) -> list[str]:
    """``A_{X,Y}_{ADD,REMOVE}`` as its four names, as a shell expands it."""
    match = re.search(r"\{([^{}]*)\}", text)
    if match is None:
        return [text]
    return [name for choice in match.group(1).split(",")
            for name in expand_braces(text[:match.start()] + choice + text[match.end():])]


def table_rows(page: Path, first_header: str) -> list[list[str]]:
    """The body rows of the page's table whose first header cell is ``first_header``, as cell lists."""
    rows: list[list[str]] = []
    inside = False
    for line in prose(page).split("\n"):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            if inside:
                break
            continue
        if not inside:
            inside = cells[0] == first_header
            continue
        if not re.fullmatch(r"[\s:|-]*", line):
            rows.append(cells)
    return rows


def resolve(dotted: str):
    """The module or attribute ``dotted`` names (``amp_rewrite.runtime.current_target``); raises if none."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise ImportError(dotted)
