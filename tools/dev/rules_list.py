"""Writes the numbered painting rules of ``docs/how-it-works.md`` from the schedule itself.

The schedule is data, :data:`amp_rewrite.paint.rules.RULES`, and each rule's
docstring says what it does. The page's list is made from them: one item per
rule in the order they run, the rule's name and the first line of its
docstring (a rule that runs a second time points at its first run), with
the sentence on where the pass stops after :data:`~amp_rewrite.paint.rules.ROOT_RULES`
before it. The list sits between two HTML comments (invisible on GitHub and
in the built site); ``tests/docs/`` holds the page to what this writes, so
a rule added, moved or redescribed fails a test until the page is rewritten.

Usage (from the repository root, with the package installed)::

    python tools/dev/rules_list.py           # rewrite the page's list
    python tools/dev/rules_list.py --check   # exit 1 if the page's list is not the schedule's
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-it-works.md"
BEGIN = "<!-- rules: written by tools/dev/rules_list.py from amp_rewrite.paint.rules.RULES -->"
END = "<!-- rules: end -->"


def rules_list(rules, roots: int) -> str:
    """The Markdown of the list: a sentence on the two halves, then one numbered item per run of a rule.

    Args:
        rules: the rule functions in the order they run.
        roots: how many of them (from the first) find the roots.
    """
    lines = [f"Rules 1 to {roots} find the roots; when none of them paints a vertex ALLOW, no op can "
             f"run in half and the pass stops there. Rules {roots + 1} to {len(rules)} spread the "
             "colours and make them agree where values must hold one dtype.", ""]
    first_run: dict[str, int] = {}
    for number, rule in enumerate(rules, start=1):
        name = rule.__name__
        if name in first_run:
            summary = f"again, as in {first_run[name]}."
        else:
            first_run[name] = number
            summary = (rule.__doc__ or "").strip().splitlines()[0]
        lines.append(f"{number}. `{name}`: {summary}")
    return "\n".join(lines)


def listed(page_text: str) -> str:
    """The list between the page's two markers, without the blank lines around it."""
    found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), page_text, re.S)
    if found is None:
        raise SystemExit(f"{PAGE}: no list between {BEGIN!r} and {END!r}")
    return found.group(1).strip("\n")


def with_list(page_text: str, markdown: str) -> str:
    """``page_text`` with ``markdown`` between the markers."""
    listed(page_text)  # the markers are there
    start = page_text.index(BEGIN) + len(BEGIN)
    return page_text[:start] + "\n\n" + markdown + "\n\n" + page_text[page_text.index(END, start):]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page's list is the schedule's")
    args = parser.parse_args()
    from amp_rewrite.paint import rules

    text = PAGE.read_text()
    markdown = rules_list(rules.RULES, len(rules.ROOT_RULES))
    if listed(text) == markdown:
        return 0
    if args.check:
        print(f"{PAGE}: the rules list is not the schedule's; run python tools/dev/rules_list.py", file=sys.stderr)
        return 1
    PAGE.write_text(with_list(text, markdown))
    print(f"rewrote the rules list of {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
