"""How the suite runs the command line and any subprocess: one runner each way, one clean environment.

- :func:`run_cli`: ``amp-rewrite ARGS`` in this process. The default: quick,
  and a test can monkeypatch what the command calls.
- :func:`run_cli_subprocess`: ``python -m amp_rewrite ARGS`` (or the installed
  ``amp-rewrite`` script) in a fresh interpreter, for what only a process
  shows: the start-up hook, TensorFlow's load-time banner, ``-v``, the console
  script itself.
- :func:`clean_env`: the environment of every subprocess the suite starts,
  these and the training fixtures' (``fixtures/harness.py``) alike.

Both runners return a :class:`CommandResult` and need the directory to run
in, so that no test depends on where pytest was started. stderr may hold
TensorFlow's lines beside ours on some machines, whatever
``TF_CPP_MIN_LOG_LEVEL`` says: a test reads our lines with
``helpers.our_lines``, never stderr as a whole.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from amp_rewrite.environment import ENABLE_ENVS, read_by_package

# What every subprocess of the suite runs with, whatever the shell that started pytest set.
FIXED_SETTINGS = {
    "TF_CPP_MIN_LOG_LEVEL": "2",  # TensorFlow's C++ INFO and WARNING lines off
    "PYTHONHASHSEED": "0",  # set order, and what follows from it, the same in every run
    "OMP_NUM_THREADS": "1",  # processes run side by side on few cores
    # The op lists alone decide, so a rewrite is the same on every machine: no step is timed
    # (the step trials have tests of their own, with their own timer).
    "AMP_REWRITE_TUNE": "0",
}
# Which Keras ``tf.keras`` names is each script's own choice: the TF1 fixtures
# ask for tf_keras (fixtures/common.py), the Keras 3 runs must not inherit it.
NOT_INHERITED = ("TF_USE_LEGACY_KERAS",)
CONSOLE_SCRIPT = Path(sysconfig.get_path("scripts")) / ("amp-rewrite.exe" if os.name == "nt" else "amp-rewrite")
TIMEOUT = 300


@dataclass(frozen=True)
class CommandResult:
    """What a command did; named as :class:`subprocess.CompletedProcess` names it, whichever runner ran it."""

    returncode: int
    stdout: str
    stderr: str


def amp_variables(environ: Mapping[str, str]) -> list[str]:
    """The variables in ``environ`` that amp-rewrite or TensorFlow's AMP reads.

    The package's own list (:func:`amp_rewrite.environment.read_by_package`),
    plus the variants of the switch NVIDIA's TensorFlow builds read
    (``TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE``, ``..._LOSS_SCALING``).
    """
    read = set(read_by_package(environ))
    return sorted(name for name in environ if name in read or name.startswith(ENABLE_ENVS))


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without :func:`amp_variables`, with :data:`FIXED_SETTINGS`, then ``extra``."""
    dropped = {*amp_variables(os.environ), *NOT_INHERITED}
    kept = {name: value for name, value in os.environ.items() if name not in dropped}
    return {**kept, **FIXED_SETTINGS, **extra}


def run_cli(*args, cwd: Path | str) -> CommandResult:
    """``amp-rewrite ARGS`` run in this process, in ``cwd``.

    stdout and stderr are what the command printed, log lines included as a
    process prints them (``amp-rewrite: WARNING: ...``, INFO with ``-v``);
    pytest's ``caplog`` still sees the records. What TensorFlow writes below
    Python never reaches them. The environment is this process's: the suite
    clears amp-rewrite's variables before every test, and a test sets one with
    ``monkeypatch.setenv``. The working directory, ``sys.stdout``,
    ``sys.stderr`` and the root logger are as they were afterwards.
    """
    from amp_rewrite.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with (_working_directory(cwd), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr),
          _logging_as_in_a_fresh_process()):
        try:
            returncode = main([str(arg) for arg in args])
        except SystemExit as exc:  # argparse: a usage error, --help, --version
            returncode = int(exc.code or 0)
    return CommandResult(returncode, stdout.getvalue(), stderr.getvalue())


def run_cli_subprocess(*args, cwd: Path | str, env: Mapping[str, str] | None = None,
                       is_console_script: bool = False, timeout: float = TIMEOUT) -> CommandResult:
    """``python -m amp_rewrite ARGS`` in a fresh interpreter in ``cwd``, with :func:`clean_env` plus ``env``.

    With ``is_console_script``, the ``amp-rewrite`` script pip installed runs
    instead. ``cwd`` matters beyond relative paths: ``-m`` puts it first on
    ``sys.path``, and a checkout there would shadow the installed package.
    """
    command = [str(CONSOLE_SCRIPT)] if is_console_script else [sys.executable, "-m", "amp_rewrite"]
    done = subprocess.run([*command, *map(str, args)], cwd=cwd, env=clean_env(**(env or {})),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return CommandResult(done.returncode, done.stdout, done.stderr)


@contextlib.contextmanager
def _working_directory(path: Path | str) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


@contextlib.contextmanager
def _logging_as_in_a_fresh_process() -> Iterator[None]:
    """The command's ``logging.basicConfig`` takes effect, as in a process of its own, and is undone after.

    ``basicConfig`` configures a root logger without handlers only, and
    pytest keeps its capture handlers there: for the run they move to the
    package's logger (so ``caplog`` still sees our records), then come back
    with the root's level.
    """
    root, package = logging.getLogger(), logging.getLogger("amp_rewrite")
    handlers, level = root.handlers[:], root.level
    for handler in handlers:
        root.removeHandler(handler)
        package.addHandler(handler)
    try:
        yield
    finally:
        for handler in root.handlers[:]:  # basicConfig's, writing to the captured stderr
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            package.removeHandler(handler)
            root.addHandler(handler)
        root.setLevel(level)
