"""The ``Session`` patches: each routes a session's calls to its :class:`ShadowRunner`.

:func:`amp_rewrite.runtime.enable` installs these on ``BaseSession``; each
takes the original method first, then the :class:`~amp_rewrite.runtime.core.Runtime`,
then the session and the method's own arguments. A session's runner and the
arguments it was made with are kept in the runtime's records
(:attr:`~amp_rewrite.runtime.records.ObjectRecords.runners`,
:attr:`~amp_rewrite.runtime.records.ObjectRecords.session_args`). Shadow
sessions, the ones the runtime makes, run unpatched.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from amp_rewrite.runtime.core import Runtime
from amp_rewrite.runtime.tf1.session.runner import ShadowRunner

# One logger for the whole package: its lines keep the name they have always had.
logger = logging.getLogger(__package__)


class SessionArgs(NamedTuple):
    """What a session was made with that its shadow sessions are made with too."""

    target: str = ""
    config: Any = None


def runner_for(session, runtime: Runtime) -> ShadowRunner | None:
    """The session's runner, created on first use; None for shadow sessions."""
    records = runtime.objects
    runner = records.runners.get(session)
    if runner is None:
        if session in records.shadow_sessions:
            return None
        args = records.session_args.get(session, SessionArgs())
        runner = records.runners[session] = ShadowRunner(session.graph, runtime, args.target, args.config)
    return runner


def patched_init(original, runtime, session, target="", graph=None, config=None, *args, **kwargs):
    runtime.objects.session_args[session] = SessionArgs(target, config)
    return original(session, target, graph, config, *args, **kwargs)


def patched_run(original, runtime, session, fetches, feed_dict=None, options=None,
                run_metadata=None):
    runner = runner_for(session, runtime)
    if runner is None:
        return original(session, fetches, feed_dict, options, run_metadata)
    return runner.run(original, session, fetches, feed_dict, options, run_metadata)


def patched_make_callable(original, runtime, session, fetches, feed_list=None,
                          accept_options=False):
    """A callable that goes through ``run``, so it runs the shadow graph too."""
    if session in runtime.objects.shadow_sessions:
        return original(session, fetches, feed_list, accept_options)
    feed_list = list(feed_list or [])

    def call(*args, options=None, run_metadata=None):
        if len(args) != len(feed_list):
            raise TypeError(f"expected {len(feed_list)} feeds, got {len(args)}")
        if not accept_options and (options is not None or run_metadata is not None):
            raise TypeError("this callable was made without accept_options=True")
        return session.run(fetches, dict(zip(feed_list, args)), options, run_metadata)

    return call


def patched_make_callable_from_options(original, runtime, session, callable_options):
    """The raw-callable API (used by Keras in graph mode), routed through ``run``."""
    if session in runtime.objects.shadow_sessions:
        return original(session, callable_options)
    if callable_options.tensor_connection:
        logger.warning("amp-rewrite: a callable with tensor connections runs the float32 graph")
        return original(session, callable_options)
    fetches = list(callable_options.fetch)
    targets = list(callable_options.target)
    feeds = list(callable_options.feed)

    def call(*args, run_metadata=None):
        values = session.run(fetches + targets, dict(zip(feeds, args)), None, run_metadata)
        return values[:len(fetches)]

    return call


def patched_partial_run_setup(original, runtime, session, fetches, feeds=None):
    runner = runner_for(session, runtime)
    if runner is None:
        return original(session, fetches, feeds)
    return runner.partial_run_setup(original, session, fetches, feeds)


def patched_partial_run(original, runtime, session, handle, fetches, feed_dict=None):
    runner = runner_for(session, runtime)
    if runner is None:
        return original(session, handle, fetches, feed_dict)
    return runner.partial_run(original, session, handle, fetches, feed_dict)


def patched_close(original, runtime, session):
    runner = runtime.objects.runners.get(session)
    if runner is not None:
        runner.close()
    return original(session)
