"""Every example the documentation marks as runnable runs, and prints what the page says it prints.

What it prints is stdout and stderr together (the runtime logs to stderr).

Each runs in a fresh directory holding a link to the repository's ``tools/``
(so ``tools/example/mlp.pb`` is where the pages say), with a fresh timing
cache and none of the variables amp-rewrite reads: Python blocks with this
interpreter, command lines with bash and this environment's ``amp-rewrite``.
A renamed flag, function or output line fails here before a reader meets it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_pages  # noqa: E402

from amp_rewrite.environment import read_by_package  # noqa: E402

EXAMPLES = doc_pages.examples()



def test_the_pages_mark_examples_of_each_kind():
    languages = {example.block.language for example in EXAMPLES}
    assert {"python", "sh"} <= languages, languages
    assert len(EXAMPLES) >= 10, [example.id for example in EXAMPLES]


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.id for example in EXAMPLES])
def test_example_runs(example, tmp_path):
    (tmp_path / "tools").symlink_to(doc_pages.REPO / "tools", target_is_directory=True)
    environ = {name: value for name, value in os.environ.items() if name not in read_by_package(os.environ)}
    environ.update(TF_CPP_MIN_LOG_LEVEL="2", XDG_CACHE_HOME=str(tmp_path / "cache"),
                   PATH=os.pathsep.join([str(Path(sys.executable).parent), environ.get("PATH", "")]))
    block = example.block
    if block.language == "python":
        script = tmp_path / "example.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        assert block.language == "sh", f"{example.id}: a runnable block is python or sh, not {block.language!r}"
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    run = subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"{example.id} failed (exit {run.returncode}):\n{block.code}\n{output[-4000:]}"
    missing = [line for line in example.prints if line not in output]
    assert not missing, f"{example.id} did not print {missing}; it printed:\n{output}"
