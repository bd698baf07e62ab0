"""What a tracing hook's function trials decided: the tuning cache they read and write, and their lines.

A trial (:class:`~amp_rewrite.runtime.tf2.function_trial.FunctionTrial`)
measures; :class:`FunctionVerdicts` keeps what it measured. A verdict goes
into the tuning cache (:mod:`amp_rewrite.tune.cache`) under the step's key
(:func:`~amp_rewrite.tune.keys.step_key`: the traced graph's ops, its inputs
with each captured variable's dtype and shape, and how the runtime rewrites),
so that the same function traced in a later run is decided before its first
call; and every decision is said in one INFO line and kept in
:attr:`FunctionVerdicts.decisions`, which
:func:`amp_rewrite.runtime.tf2.tracing.step_decisions` reads.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import replace

from amp_rewrite import tf_internals
from amp_rewrite.config import Config
from amp_rewrite.errors import NO_MESSAGE, first_line
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME
from amp_rewrite.tune import keys
from amp_rewrite.tune.cache import TuneCache
from amp_rewrite.tune.trial import MARGIN, MixedVerdict, StepVerdict, switch_line, verdict_of

logger = logging.getLogger(LOGGER_NAME)


class FunctionVerdicts:
    """The cache, the keys and the lines of a hook's function trials.

    Attributes:
        config: returns the rewrite configuration (read at first use: the target chosen, the device type).
        cache_dir: where the tuning cache lives (None: the user's cache directory).
        is_measuring_again: the cache is not read: every step is tried, and its verdict replaces the cached one
            (``AMP_REWRITE_TUNE=again``).
        decisions: each function decided in this process, oldest first: its name, verdict (a
            :class:`~amp_rewrite.tune.trial.MixedVerdict` for a step that tried a mixed body), and the
            function (held weakly); a re-check that switched a function adds its new verdict.
    """

    def __init__(self, *, config: Callable[[], Config], cache_dir: str | None = None,
                 is_measuring_again: bool = False):
        self.config = config
        self.cache_dir = cache_dir
        self.is_measuring_again = is_measuring_again
        self.decisions: list[tuple[str, StepVerdict | MixedVerdict, weakref.ref]] = []
        self._cache: TuneCache | None = None
        self._settings: str | None = None
        self._said_lists: set[str] = set()
        # traced body (an AtomicFunction) → its step key: a large step's key costs a tenth of a second
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def target(self) -> str:
        return self.config().target

    @property
    def device_type(self) -> str:
        return self.config().device_type or "CPU"

    @property
    def cache(self) -> TuneCache:
        """The tuning cache of this device and TensorFlow (made at first use)."""
        if self._cache is None:
            from amp_rewrite.tune.cache import cache_here

            self._cache = cache_here(self.cache_dir, self.device_type)
        return self._cache

    @property
    def settings(self) -> str:
        """How the runtime rewrites, for the step keys (:func:`~amp_rewrite.tune.keys.rewrite_settings`)."""
        if self._settings is None:
            self._settings = keys.rewrite_settings(self.config())
        return self._settings

    def is_deterministic(self) -> bool:
        """Whether op determinism is on: then no timing decides (the cache or the lists do)."""
        return tf_internals.is_op_determinism_enabled()

    # --- the cache --------------------------------------------------------

    def key(self, state: dict) -> str:
        """The step key of the function whose state is ``state`` (:func:`~amp_rewrite.tune.keys.step_key`)."""
        body = state["_inference_function"]
        key = self._keys.get(body)
        if key is None:
            graph = tf_internals.graph_in_state(state)
            functions = [f.definition for f in tf_internals.graph_functions(graph).values()]
            inputs = [input_text(tensor) for tensor in graph.inputs]
            key = self._keys[body] = keys.step_key([*functions, body.definition], inputs, settings=self.settings)
        return key

    def cached(self, key: str) -> StepVerdict | None:
        """The verdict of the times the cache holds for ``key`` (this process's trials put theirs there too)."""
        timing = self.cache.get(key)
        return verdict_of(timing, is_cached=True, source=str(self.cache.path)) if timing is not None else None

    def was_mixed(self, key: str) -> bool:
        """Whether the trial of ``key``'s step kept a mixed body (its confirming trial's times say so)."""
        timing = self.cache.get(key + keys.MIXED_KEY)
        return timing is not None and timing.half <= (1.0 - MARGIN) * timing.float32

    def remember(self, key: str, verdict: StepVerdict, name: str) -> None:
        """Puts the verdict's two best times into the cache, saved at once."""
        self.cache.put(key, replace(verdict.timing(), what=f"tf.function {name}, {self.target}"))
        self.cache.save()

    def keep(self, key: str, verdict: StepVerdict | MixedVerdict, name: str) -> None:
        """Remembers a trial's verdict where it is clear; a verdict measured again that is not clear takes the
        old one out of the cache too."""
        if verdict.is_settled if isinstance(verdict, MixedVerdict) else verdict.is_clear:
            self.remember(key, verdict.pure if isinstance(verdict, MixedVerdict) else verdict, name)
        elif self.is_measuring_again:
            self.cache.discard(key)
            self.cache.save()

    # --- the lines --------------------------------------------------------

    def say(self, name: str, verdict: StepVerdict | MixedVerdict, concrete_function, *,
            unmixed: str | None = None) -> None:
        """The INFO line of a decided function (``unmixed``: why no mixed body was tried); the decision is kept."""
        self.decisions.append((name, verdict, weakref.ref(concrete_function)))
        reason = verdict.reason(self.target, self.device_type)
        if unmixed:
            reason += f"; no mixed body: {unmixed}"
        if getattr(verdict, "is_cached", False) or getattr(getattr(verdict, "pure", None), "is_cached", False):
            if self.is_deterministic():
                reason += "; op determinism is on, so it is not checked again"
        if isinstance(verdict, MixedVerdict) and verdict.is_mixed:
            logger.info("amp-rewrite: tf.function %s runs %d of %d half regions in %s: %s", name,
                        verdict.half_regions, verdict.regions, self.target, reason)
        elif verdict.is_half:
            logger.info("amp-rewrite: tf.function %s runs in %s: %s", name, self.target, reason)
        else:
            logger.info("amp-rewrite: tf.function %s stays float32: %s", name, reason)

    def say_switch(self, name: str, cached: StepVerdict, verdict: StepVerdict, concrete_function, *,
                   calls: int) -> None:
        """The INFO line of a function a re-check after ``calls`` calls switched from its ``cached`` verdict; the
        decision is kept."""
        self.decisions.append((name, verdict, weakref.ref(concrete_function)))
        logger.info("amp-rewrite: tf.function %s %s", name,
                    switch_line(cached, verdict, self.target, self.device_type, calls=calls))

    def say_untried(self, name: str, exc: Exception) -> None:
        """The INFO line of a function that runs its rewrite untried: its float32 body could not be built."""
        logger.info("amp-rewrite: tf.function %s runs in %s, not tried: its float32 body could not be built: %s",
                    name, self.target, first_line(exc, with_type=True, if_empty=NO_MESSAGE))

    def say_lists_decide(self, name: str) -> None:
        """The line of a function that would be tried, under op determinism: the op lists decide (once per name:
        Keras traces its one-step function more than once)."""
        if name in self._said_lists:
            return
        self._said_lists.add(name)
        logger.info("amp-rewrite: tf.function %s runs in %s as the op lists say: op determinism is on, so no timing "
                    "decides, and the tuning cache holds no verdict of this step", name, self.target)


def input_text(tensor) -> tuple[str, tuple]:
    """An input of a step's graph as its key takes it: dtype and shape; a captured variable's handle with the
    variable's dtype and shape (:func:`~amp_rewrite.tune.keys.resource_input`)."""
    shape = tuple(tensor.shape.as_list()) if tensor.shape.rank is not None else ()
    dtype = tensor.dtype.name
    if dtype == "resource":
        dtype = keys.resource_input(tf_internals.resource_handle_types(tensor))
    return dtype, shape
