"""Measured precision: whole steps timed in float32 and in half on this device, the faster kept.

Internal: nothing here is part of the public API (that is :mod:`amp_rewrite`'s
face); modules may move between releases.

- :mod:`~amp_rewrite.tune.steps`: a whole step's trial, its half and float32 bodies alternated
  (what ``ENABLE_AUTO_MP`` does unless ``AMP_REWRITE_TUNE=0``), and its verdict;
- :mod:`~amp_rewrite.tune.graph_steps`: two GraphDefs stepped in TF1 sessions on the same feeds,
  by that schedule (``--tune`` and ``doctor --benchmark``);
- :mod:`~amp_rewrite.tune.whole_graph`: ``--tune``, the rewrite kept only where it ran faster;
- :mod:`~amp_rewrite.tune.shapes`: each op's input shapes, from TensorFlow's shape inference;
- :mod:`~amp_rewrite.tune.tuner`: with ``AMP_REWRITE_TUNE=1``, heavy ops timed one by one;
- :mod:`~amp_rewrite.tune.timing`: one op timed in each precision, its Casts included;
- :mod:`~amp_rewrite.tune.regions`: connected regions of half ops, timed as a whole;
- :mod:`~amp_rewrite.tune.cache`: the timings, cached per device and TensorFlow version.
"""
