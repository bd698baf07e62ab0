"""Accuracy-guarded rewrite: check the half graph against float32 and fall back where it fails.

The steps, all in memory:

1. **Reference run.** The float32 graph runs once on the sample inputs. The
   same run records ``max |value|`` of every float tensor it can observe (main
   graph, outside v1 loop frames and cond branches) through reductions
   added to a scratch copy, so no tensor is kept.
2. **Range rule** (float16 only; bfloat16 has float32's range): a node
   that produces or reads a tensor beyond ``range_fraction`` of the half
   range stays float32. Casting that tensor into any half consumer would
   overflow, so its readers stay float32 too.
3. **Pattern rules** (float16): softmax reductions stay float32; an epsilon
   smaller than half's smallest normal, added before a division, square
   root, reciprocal or log, keeps both ops float32; layer-norm statistics
   stay float32 while their elementwise tail may be half.
4. **Check run.** If the outputs are not within tolerance (NaN and inf always
   fail), connected half regions go back to float32. Regions are ordered by
   the largest magnitude seen in them, riskiest first. For each culprit, a
   binary search finds the shortest prefix of regions whose return makes the
   check pass, and the last region of that prefix is kept float32. With one
   culprit among R regions this takes about ``log2(R) + 2`` runs; ``max_runs``
   bounds the total.

The modules: :mod:`~amp_rewrite.validate.search` (:func:`validated_rewrite`
and the region search), :mod:`~amp_rewrite.validate.risk` (the range and
pattern rules), :mod:`~amp_rewrite.validate.feeds` (sample inputs and the
tensors a run can observe), :mod:`~amp_rewrite.validate.runner` (the
TensorFlow runs), :mod:`~amp_rewrite.validate.tolerance`,
:mod:`~amp_rewrite.validate.report` and :mod:`~amp_rewrite.validate.progress`.
"""

from amp_rewrite.validate.feeds import random_feeds
from amp_rewrite.validate.progress import terminal_progress
from amp_rewrite.validate.report import ValidationError, ValidationReport
from amp_rewrite.validate.risk import pattern_rules, range_rule
from amp_rewrite.validate.search import half_regions, validated_rewrite
from amp_rewrite.validate.tolerance import METRICS, Tolerance

__all__ = ["METRICS", "Tolerance", "ValidationError", "ValidationReport", "half_regions", "pattern_rules",
           "random_feeds", "range_rule", "terminal_progress", "validated_rewrite"]
