"""The pages agree with the code: variables, paths, names, links, the API face and the rules."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_pages  # noqa: E402

import amp_rewrite  # noqa: E402
from amp_rewrite import environment  # noqa: E402

PAGES = doc_pages.pages()
ENVIRONMENT_PAGE = doc_pages.DOCS / "environment.md"


class _Recorder(Mapping):
    """An empty environment that remembers every name it was asked for."""

    def __init__(self):
        self.asked: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        raise KeyError(name)

    def get(self, name, default=None):
        self.asked.add(name)
        return default

    def __contains__(self, name) -> bool:
        self.asked.add(name)
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _variables_read() -> set[str]:
    """What the package reads: environment.NAMES, and every name its two readers ask an environment for."""
    recorder = _Recorder()
    amp_rewrite.Config.from_env(recorder)
    doc_pages.resolve("amp_rewrite.runtime.settings.RuntimeSettings").from_env(recorder)
    return set(environment.NAMES) | set(environment.ENABLE_ENVS) | recorder.asked


def _variables_documented() -> list[str]:
    names = []
    for row in doc_pages.table_rows(ENVIRONMENT_PAGE, "variable"):
        cell = re.fullmatch(r"`([A-Z0-9_{},]+)(?:=[^`]*)?`", row[0])
        assert cell, f"docs/environment.md: the first cell {row[0]!r} is not one `VARIABLE` (or `VARIABLE=value`)"
        names += doc_pages.expand_braces(cell.group(1))
    return names


def test_the_recorder_sees_the_readers_reads():
    read = _variables_read()
    assert {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL", "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD",
            "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_BLACKLIST_REMOVE", "AMP_LOSS_SCALE", "ENABLE_AUTO_MP"} <= read


def test_every_variable_the_package_reads_is_in_the_reference_table():
    missing = sorted(_variables_read() - set(_variables_documented()))
    assert not missing, f"docs/environment.md's table lacks {missing}"


def test_the_reference_table_names_only_variables_the_package_reads():
    documented = _variables_documented()
    assert len(documented) == len(set(documented)), "a variable has two rows"
    extra = sorted(set(documented) - _variables_read())
    assert not extra, f"docs/environment.md's table names {extra}, which the package does not read"


# `amp_rewrite/x.py`, `tools/x.py`, `tests/...`, `lists/...`, `.ci/run`, the start-up files; not a glob,
# a placeholder (<target>) or a part of a longer path (…/lists/float16/allow.txt).
PATH = re.compile(r"(?<![\w./…-])((?:amp_rewrite|tools|tests|lists|docs|\.ci)/[\w./-]*|_amp_rewrite_\w+\.py"
                  r"|amp_rewrite_autoload\.(?:pth|start))(?![\w*<{])")
DOTTED = re.compile(r"(?<![\w./])(amp_rewrite(?:\.\w+)+)")
NOT_IN_THE_CHECKOUT = ("docs/_build",)


def _mentions(pattern: re.Pattern) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for match in pattern.finditer(page.read_text()):
            found.append((str(page.relative_to(doc_pages.REPO)), match.group(1).rstrip(".")))
    return sorted(set(found))


def test_every_path_the_pages_mention_exists():
    missing = [f"{page}: {path}" for page, path in _mentions(PATH)
               if not path.startswith(NOT_IN_THE_CHECKOUT) and not (doc_pages.REPO / path).exists()]
    assert not missing, "not in the repository:\n" + "\n".join(missing)


def test_the_pages_mention_paths_and_names():
    assert len(_mentions(PATH)) > 40 and len(_mentions(DOTTED)) > 20


def test_every_dotted_name_the_pages_mention_resolves():
    unresolved = []
    for page, dotted in _mentions(DOTTED):
        try:
            doc_pages.resolve(dotted)
        except (ImportError, AttributeError) as error:
            unresolved.append(f"{page}: {dotted} ({type(error).__name__}: {error})")
    assert not unresolved, "\n".join(unresolved)


def _relative_links() -> list[tuple[str, str]]:
    return [(str(page.relative_to(doc_pages.REPO)), target) for page in PAGES for target in doc_pages.links(page)
            if not re.match(r"[a-z]+:", target)]


def test_relative_links_reach_a_file_and_a_heading():
    broken = []
    for page, target in _relative_links():
        path, _, anchor = target.partition("#")
        source = doc_pages.REPO / page
        file = (source.parent / path).resolve() if path else source
        if not file.exists():
            broken.append(f"{page}: {target} (no file {file})")
        elif anchor and file.suffix != ".md":
            broken.append(f"{page}: {target} (an anchor of a file that is not a page)")
        elif anchor and anchor not in [doc_pages.slug(title) for title in doc_pages.headings(file)]:
            broken.append(f"{page}: {target} (no heading of {file.name} has that anchor)")
    assert not broken, "\n".join(broken)


def test_the_pages_link_to_each_other():
    assert len(_relative_links()) > 50


def test_the_api_page_documents_the_face():
    text = (doc_pages.DOCS / "api.md").read_text()
    documented = re.findall(r"^\.\. auto(?:function|class|exception):: amp_rewrite\.(\w+)$", text, re.M)
    assert len(documented) == len(set(documented))
    face = set(amp_rewrite.__all__)
    assert set(documented) == face, (sorted(face - set(documented)), sorted(set(documented) - face))


def _rules_tool():
    spec = importlib.util.spec_from_file_location("rules_list", doc_pages.REPO / "tools" / "dev" / "rules_list.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_numbered_rules_are_the_ones_the_schedule_writes():
    """The page's list is what tools/dev/rules_list.py makes of RULES and the rules' docstrings."""
    rules = doc_pages.resolve("amp_rewrite.paint.rules")
    tool = _rules_tool()
    listed = tool.listed((doc_pages.DOCS / "how-it-works.md").read_text())
    assert listed == tool.rules_list(rules.RULES, len(rules.ROOT_RULES)), (
        "docs/how-it-works.md: the rules list is not the schedule's; run python tools/dev/rules_list.py")
    numbered = re.findall(r"^(\d+)\. `(\w+)`: ", listed, re.M)
    assert [name for _, name in numbered] == [rule.__name__ for rule in rules.RULES]


# What users paste, and what CI runs: the README's first two commands, as they were.
SET_UP = [
    'pip install ".[cpu]" && amp-rewrite tools/example/mlp.pb /tmp/mlp_amp.pb',
    'pip install ".[cpu,test]" && pip install --no-deps "tf-keras==2.21.*" "tf-slim==1.1.0" '
    '&& pytest -q -p no:cacheprovider',
]


def test_the_readme_opens_with_the_set_up_commands_and_the_switch():
    readme = doc_pages.REPO / "README.md"
    first = doc_pages.blocks(readme)[0]
    assert first.code.split("\n")[:-1] == SET_UP
    lines = readme.read_text().split("\n")
    assert any("ENABLE_AUTO_MP=1" in line for line in lines[:40])
    assert first.line < lines.index(next(line for line in lines if line.startswith("## ")))


def test_the_readme_shows_the_first_commands_summary_line():
    # .ci/check_dists.sh runs the first command and compares with the first such line.
    shown = re.search(r"`(converted [^`]*)`", (doc_pages.REPO / "README.md").read_text())
    assert shown and shown.group(1) == ("converted 14/16 nodes to float16, 2 casts, "
                                        "100.0% of MatMul/Conv FLOPs in float16")
