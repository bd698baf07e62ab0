"""Sessions that run the rewritten graph while the script keeps its own.

Each patched ``Session`` gets a :class:`ShadowRunner` on its first ``run``.
Its :class:`ShadowKeeper` has a :class:`~amp_rewrite.runtime.tf1.shadow_graph.ShadowGraph`
rewrite the session's graph (preserving the fetches and feeds seen so far
and every node without consumers) and import the result into a shadow
``tf.Graph`` (node names are preserved); the runner runs everything in the shadow's
``Session`` from then on, so variables live there. Guarantees:

- ``sess.graph`` is the script's graph; fetched values come back in the dtype
  the script built (half values are cast back on the host); any tensor the
  script could feed can be fed (the value is cast to the shadow's dtype).
- Ops the script adds later that the target's allow list converts (a model
  built, or grown, after the first ``run``) make the keeper rewrite the whole
  graph again into a new shadow; every initialised variable is copied into
  it by name, other state (iterators, queues, tables) starts afresh.
- Other ops added later (summaries, a Saver) are imported as they are
  (float32), with a Cast back to the script's dtype wherever they read a
  tensor that became half.
- Loss-scale variables the script's initialiser did not cover (it ran before
  the optimizer existed, or initialised an explicit list) are initialised
  when a plan first needs them.
- Each (graph version, fetches, feeds) gets one :class:`RunPlan`, built once.
  A call whose fetches are tensors/ops (alone, or a list or tuple of them)
  and whose feeds are tensors of numpy values also gets a :class:`FastCall`
  on its second run, keyed by the identity of those objects: later such calls
  skip TensorFlow's fetch mapping and feed parsing and run a callable made
  once in the shadow session.
- ``make_callable``, the raw callables Keras uses, and partial runs go to the
  shadow graph too.
- With step trials on (``ENABLE_AUTO_MP`` unless ``AMP_REWRITE_TUNE=0``), a
  step whose plan runs half ops first alternates it with a float32 copy of
  the step imported beside it over the same variables and resources, with
  the script's functions and without loss scaling
  (:mod:`~amp_rewrite.runtime.tf1.session.float32_copy`), and keeps the faster
  for good, saying so in one INFO line;
  :func:`amp_rewrite.runtime.session_step_decisions` returns the verdicts. A later run reads them from the tuning cache.
- If the rewrite, or any run of the rewritten graph, fails, a warning names
  the reason and the session runs the script's float32 graph from then on,
  with the variable values the shadow held; with ``AMP_REWRITE_STRICT=1`` a
  :class:`RuntimeRewriteError` is raised. An error that the float32 graph
  raises too (a bad feed, say), or that is how scripts stop (the end of the
  input), reaches the script unchanged and keeps the rewrite.

The modules, one job each:

- :mod:`~amp_rewrite.runtime.tf1.session.patches`: the ``Session`` methods
  :func:`amp_rewrite.runtime.enable` installs, each routing to the session's runner;
- :mod:`~amp_rewrite.runtime.tf1.session.runner`: :class:`ShadowRunner`, a call's
  values onto the shadow and back;
- :mod:`~amp_rewrite.runtime.tf1.session.plans` and
  :mod:`~amp_rewrite.runtime.tf1.session.fast_calls`: how a call maps onto the
  shadow graph (:class:`RunPlan` per :class:`PlanKey`, :class:`FastCall` per
  :data:`CallKey`);
- :mod:`~amp_rewrite.runtime.tf1.session.keeper`: :class:`ShadowKeeper`, which
  shadow is current (built, grown, a float32 copy) and what is made on it;
- :mod:`~amp_rewrite.runtime.tf1.session.session_trial`: the step trials, each
  step's float32 copy in the shadow, and their verdicts;
- :mod:`~amp_rewrite.runtime.tf1.session.fallback`: the explicit
  :class:`FallbackState` and whose a failure is.

The loss-scale lines a session logs from its reports come from
:mod:`~amp_rewrite.runtime.loss_scale.tf1_session_log`. Every module here,
and that one, logs as ``amp_rewrite.runtime.tf1.session``.
"""


from amp_rewrite.errors import RuntimeRewriteError as RuntimeRewriteError  # the path scripts import
from amp_rewrite.runtime.tf1.session.fallback import FallbackState, Mode
from amp_rewrite.runtime.tf1.session.fast_calls import CallKey, FastCall
from amp_rewrite.runtime.tf1.session.keeper import ShadowKeeper
from amp_rewrite.runtime.tf1.session.patches import (
    patched_close,
    patched_init,
    patched_make_callable,
    patched_make_callable_from_options,
    patched_partial_run,
    patched_partial_run_setup,
    patched_run,
    runner_for,
)
from amp_rewrite.runtime.tf1.session.plans import PlanKey, RunPlan
from amp_rewrite.runtime.tf1.session.runner import ShadowRunner
from amp_rewrite.runtime.tf1.shadow_graph import CAST_BACK_SUFFIX as CAST_BACK_SUFFIX  # re-exported

__all__ = ["CAST_BACK_SUFFIX", "CallKey", "FallbackState", "FastCall", "Mode",
           "PlanKey", "RunPlan", "RuntimeRewriteError", "ShadowKeeper", "ShadowRunner", "patched_close",
           "patched_init", "patched_make_callable", "patched_make_callable_from_options", "patched_partial_run",
           "patched_partial_run_setup", "patched_run", "runner_for"]
