"""Measured precision: whole steps timed in float32 and in half on this device, the faster kept.

Internal: nothing here is part of the public API (that is :mod:`amp_rewrite`'s
face); modules may move between releases.

- :mod:`~amp_rewrite.tune.trial`: the one schedule, margin and verdict of a trial, its half and
  float32 bodies alternated, that a ``tf.function``'s, a session step's and ``--tune``'s trials run
  (what ``ENABLE_AUTO_MP`` does unless ``AMP_REWRITE_TUNE=0``);
- :mod:`~amp_rewrite.tune.keys`: what a verdict applies to, the keys of the cached times;
- :mod:`~amp_rewrite.tune.graph_sessions`: two GraphDefs stepped in TF1 sessions on the same feeds,
  by that schedule (``--tune`` and ``doctor --benchmark``);
- :mod:`~amp_rewrite.tune.whole_graph`: ``--tune``, the rewrite kept only where it ran faster;
- :mod:`~amp_rewrite.tune.step_regions`: the half regions of a rewritten step, their op times in a
  profiled step of each body, and the mixed step those times propose;
- :mod:`~amp_rewrite.tune.step_stats`: each node's op time in one traced TF1 step;
- :mod:`~amp_rewrite.tune.cache`: the timings, cached per device, TensorFlow version and amp-rewrite version;
- :mod:`~amp_rewrite.tune.cache_files`: the cache's files in words, and their removal (``amp-rewrite cache``).
"""
