"""Counts a suite run's results by what they exercise, as the README's TensorFlow-version table shows them.

    python -m pytest --junitxml=RUN.xml ...        (tools/dev/test_tf_version.sh VERSION -- --junitxml=RUN.xml)
    python tools/dev/tf_version_table.py RUN.xml [RUN.xml ...]

Prints one markdown row per run: passed/failed (and skipped) per column, then
the whole suite. A test belongs to one column, by where it sits in tests/
(which mirrors the package) and, for the TF2 loop tests parametrized by
training style, by that style:

- TF1 sessions: tests/runtime/ outside tf2/ (Session.run under ENABLE_AUTO_MP,
  TF1 loss scaling, and the runtime's shared parts: start-up, target, records,
  multi-worker agreement, profiles);
- tf.function: tests/runtime/tf2/ (tracing, swaps, XLA) and test_tf_internals.py;
- Keras fit: tests/runtime/tf2/test_keras.py and the ``keras_train_step`` style;
- custom loops: the Keras 3 ``keras_function``, ``keras_eager``, ``keras_mirrored`` styles
  and the rest of tests/runtime/tf2/test_loss_scale.py and test_fallback.py;
- tf_keras: the ``tf_keras_*`` styles (run with TF_USE_LEGACY_KERAS=1);
- offline pass: everything else (the rewrite, CLI, SavedModels, validation, reports, docs).
"""

from __future__ import annotations

import argparse
import re
import xml.etree.ElementTree as ET
from collections import Counter

COLUMNS = ("offline pass", "TF1 sessions", "tf.function", "Keras fit", "custom loops", "tf_keras")


def column(classname: str, name: str) -> str:
    """The column a test counts in: its JUnit class name (``tests.runtime.tf2.test_keras``) and its name."""
    style = re.search(r"\[(keras_\w+|tf_keras_\w+)\]", name)
    if style is not None:
        kind = style.group(1)
        if kind.startswith("tf_keras"):
            return "tf_keras"
        return "Keras fit" if kind == "keras_train_step" else "custom loops"
    parts = classname.split(".")
    module = parts[-1]
    if "tf2" in parts:
        if module == "test_keras":
            return "Keras fit"
        return "custom loops" if module in ("test_loss_scale", "test_fallback") else "tf.function"
    if "runtime" in parts:
        return "TF1 sessions"
    return "tf.function" if module == "test_tf_internals" else "offline pass"


def outcome(case: ET.Element) -> str:
    if case.find("skipped") is not None:
        return "skipped"
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    return "passed"


def counts(path: str) -> dict[str, Counter]:
    """Outcome counts per column (and ``suite``) of one JUnit XML file."""
    table: dict[str, Counter] = {name: Counter() for name in (*COLUMNS, "suite")}
    for case in ET.parse(path).iter("testcase"):
        result = outcome(case)
        table[column(case.get("classname", ""), case.get("name", ""))][result] += 1
        table["suite"][result] += 1
    return table


def cell(counter: Counter) -> str:
    text = f"{counter['passed']}/{counter['failed']}"
    return text + (f" ({counter['skipped']} skipped)" if counter["skipped"] else "")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN.xml", help="JUnit XML files written by pytest")
    args = parser.parse_args(argv)
    print("| run | " + " | ".join(COLUMNS) + " | suite |")
    print("|---" * (len(COLUMNS) + 2) + "|")
    for path in args.runs:
        table = counts(path)
        print(f"| {path} | " + " | ".join(cell(table[name]) for name in (*COLUMNS, "suite")) + " |")


if __name__ == "__main__":
    main()
