"""The pass itself: which type attributes become half, and the Casts that follow.

Internal: nothing here is part of the public API (that is :mod:`amp_rewrite`'s
face); modules may move between releases.

- :mod:`~amp_rewrite.paint.op_lists` and :mod:`~amp_rewrite.paint.keep_patterns`:
  the allow/infer/deny/clear lists and the name patterns kept float32;
- :mod:`~amp_rewrite.paint.context`: the facts the rules read;
- :mod:`~amp_rewrite.paint.tensor_lists`: data structures whose ops share an element type;
- :mod:`~amp_rewrite.paint.rules`: the painting rules, in the order they run;
- :mod:`~amp_rewrite.paint.read_outs`, :mod:`~amp_rewrite.paint.normalization`,
  :mod:`~amp_rewrite.paint.half_range` and :mod:`~amp_rewrite.paint.saturation`:
  what four of those rules keep float32, the reductions a user reads and the
  arithmetic after them, a norm's mean and variance, the ops reading a value
  beyond the half range, and a Sigmoid whose gradient reads its output;
- :mod:`~amp_rewrite.paint.fusions`: the bias gradients painted half beside their filter
  gradients, so that oneDNN fuses the two in bfloat16;
- :mod:`~amp_rewrite.paint.casts`: retyped attrs, folded Consts and inserted Casts;
- :mod:`~amp_rewrite.paint.checks`: the output's structural postconditions;
- :mod:`~amp_rewrite.paint.explain`: every node's outcome, in a sentence.

:mod:`amp_rewrite.pipeline` runs them in order; they import only :mod:`amp_rewrite.graph`.
"""
