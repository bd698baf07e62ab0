"""The command's process: its exit codes, SIGTERM, and what reaches the user's stderr.

SIGTERM raises :class:`Terminated` while a command runs, the way SIGINT
raises ``KeyboardInterrupt``, so staged outputs are removed on the way out and
the command exits 143. :func:`set_up_output` gives log records the
``amp-rewrite: LEVEL:`` prefix and, unless ``-v``, keeps TensorFlow's
load-time banner away from the user (:func:`quiet_tensorflow_import`).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import tempfile
from contextlib import contextmanager
from types import SimpleNamespace

import _amp_rewrite_import_hook as import_hook

EXIT_OK, EXIT_BAD_INPUT, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED, EXIT_TERMINATED = 128 + 2, 128 + 15


def set_up_output(verbose: int) -> None:
    """Log records as ``amp-rewrite: LEVEL: message`` (INFO with -v, DEBUG with -vv); TensorFlow quiet unless -v."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="amp-rewrite: %(levelname)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not verbose:
        quiet_tensorflow_import()


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that staged outputs are removed on the way out."""


def _on_sigterm(signum, frame):
    raise Terminated()


@contextmanager
def sigterm_raises_terminated():
    """While the block runs, SIGTERM raises :class:`Terminated`; the previous handler is put back after it."""
    previous_sigterm = _install_sigterm()
    try:
        yield
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)


def _install_sigterm():
    """Turns SIGTERM into :class:`Terminated` while the command runs (main thread only)."""
    try:
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave signals alone
        return None


def quiet_tensorflow_import() -> None:
    """Makes the first import of TensorFlow, whenever it comes, keep its load-time banner from the user.

    While it loads, TensorFlow's C++ code writes lines such as ``WARNING: All
    log messages before absl::InitializeLog() is called are written to
    STDERR`` or ``I0000 ... cpu_feature_guard.cc ...`` straight to file
    descriptor 2, on some CPUs whatever ``TF_CPP_MIN_LOG_LEVEL`` says. While
    the ``tensorflow`` package executes, descriptor 2 points at a temporary
    file, which is dropped when the import succeeds and passed on when it
    fails. Python's own ``sys.stderr`` (warnings, our messages) still reaches
    the user, and so does a fatal signal's traceback. The import happens only
    if a step needs TensorFlow, so an error found before that stays quick.
    """
    import_hook.around_import(_banner_kept_from_user, owner=import_hook.CLI)


@contextmanager
def _banner_kept_from_user():
    """Descriptor 2 captured while TensorFlow loads; what was captured is passed on if the import fails."""
    with _descriptor_2_captured() as captured:
        try:
            yield
        except BaseException:
            captured.replay = True
            raise


@contextmanager
def _descriptor_2_captured():
    """Points file descriptor 2 at a temporary file; Python's ``sys.stderr`` keeps the real one."""
    captured = SimpleNamespace(replay=False)  # set replay to pass what was captured on
    try:
        sys.stderr.flush()
        real = os.dup(2)
    except (OSError, AttributeError, ValueError):  # no usable stderr: nothing to protect
        yield captured
        return
    python_stderr = sys.stderr
    watching = not faulthandler.is_enabled()
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        replacement = open(real, "w", encoding=getattr(python_stderr, "encoding", None) or "utf-8",
                           errors="backslashreplace", buffering=1, closefd=False)
        sys.stderr = replacement
        if watching:
            faulthandler.enable(file=real)
        try:
            yield captured
        finally:
            if watching:
                faulthandler.disable()
            replacement.close()
            sys.stderr = python_stderr
            os.dup2(real, 2)
            os.close(real)
            if captured.replay:
                sink.seek(0)
                python_stderr.write(sink.read().decode(errors="backslashreplace"))
                python_stderr.flush()
