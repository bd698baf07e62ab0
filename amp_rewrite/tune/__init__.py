"""Measured precision: steps, regions and heavy ops timed in float32 and in half on this device.

Internal: nothing here is part of the public API (that is :mod:`amp_rewrite`'s
face); modules may move between releases.

- :mod:`~amp_rewrite.tune.steps`: a whole step's trial, its half and float32 bodies alternated
  (what ``ENABLE_AUTO_MP`` does unless ``AMP_REWRITE_TUNE=0``);
- :mod:`~amp_rewrite.tune.step_regions`: the half regions of a rewritten step, their op times in a
  profiled half and float32 step, and the mixed step those times propose;
- :mod:`~amp_rewrite.tune.tuner`: with ``--tune`` or ``AMP_REWRITE_TUNE=1``, which ops to time and
  the verdicts the painting reads;
- :mod:`~amp_rewrite.tune.shapes`: each op's input shapes, from TensorFlow's shape inference;
- :mod:`~amp_rewrite.tune.timing`: one op timed in each precision, its Casts included;
- :mod:`~amp_rewrite.tune.regions`: connected regions of half ops, timed as a whole;
- :mod:`~amp_rewrite.tune.cache`: the timings, cached per device and TensorFlow version.
"""
