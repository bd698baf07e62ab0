"""The loss-scaling core both adapters build on: the seed and unscaling, the count, the guarded step."""

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite.runtime.loss_scale import core
from amp_rewrite.runtime.loss_scale.core import (
    GuardedStep,
    count_nonfinite,
    create_state,
    inverse_of,
    seed_gradient,
    unscale,
)
from amp_rewrite.runtime.settings import LossScaleSettings


def test_the_seed_scales_the_gradient_and_unscaling_gives_it_back():
    x = tf.constant([[1.0, 2.0]])
    weight = tf.Variable([[3.0], [4.0]])
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(tf.matmul(x, weight))
    scale = tf.constant(1024.0)
    plain = tape.gradient(loss, weight).numpy()
    scaled = tape.gradient(loss, weight, output_gradients=seed_gradient(loss, scale))
    np.testing.assert_array_equal(scaled.numpy(), 1024.0 * plain)
    np.testing.assert_array_equal(unscale(scaled, inverse_of(scale)).numpy(), plain)
    halved = tape.gradient(loss, weight, output_gradients=seed_gradient(loss, scale, tf.constant(0.5)))
    np.testing.assert_array_equal(halved.numpy(), 512.0 * plain)


def test_the_seed_and_the_unscaled_gradient_keep_a_half_dtype():
    seed = seed_gradient(tf.constant([1.0, 2.0], tf.float16), tf.constant(4.0))
    assert seed.dtype == tf.float16
    np.testing.assert_array_equal(seed.numpy(), [4.0, 4.0])
    grad = unscale(tf.constant([8.0], tf.float16), inverse_of(tf.constant(4.0)))
    assert grad.dtype == tf.float16
    np.testing.assert_array_equal(grad.numpy(), [2.0])


def test_unscale_keeps_sparse_gradients_sparse_and_none_none():
    sparse = tf.IndexedSlices(tf.constant([[8.0, 16.0]]), tf.constant([1]), tf.constant([3, 2]))
    unscaled = unscale(sparse, inverse_of(tf.constant(8.0)))
    assert isinstance(unscaled, tf.IndexedSlices)
    np.testing.assert_array_equal(unscaled.values.numpy(), [[1.0, 2.0]])
    np.testing.assert_array_equal(unscaled.indices.numpy(), [1])
    assert unscale(None, inverse_of(tf.constant(8.0))) is None
    assert float(inverse_of(tf.constant(0.0))) == 0.0


def test_count_nonfinite_counts_dense_and_sparse_gradients_but_not_missing_ones():
    sparse_nan = tf.IndexedSlices(tf.constant([np.nan]), tf.constant([0]), tf.constant([3]))
    grads = [tf.constant([1.0, np.inf]), None, sparse_nan, tf.constant([2.0])]
    assert float(count_nonfinite(grads)) == 2.0
    assert float(count_nonfinite([None, None])) == 0.0


class AddOne(GuardedStep):
    """A guarded step whose apply adds 1 to ``target``; each skip adds 1 to ``said``."""

    def __init__(self, state, settings):
        super().__init__(state, settings)
        self.target = tf.Variable(0.0)
        self.said = tf.Variable(0)

    def build(self, distribution, nonfinite):
        is_finite = tf.equal(self.first_replica(distribution, nonfinite), 0.0)

        def add_one():
            self.target.assign_add(1.0)

        applied = self.apply_or_skip(distribution, is_finite, add_one, (), skip=lambda: self.said.assign_add(1))
        with tf.control_dependencies([applied]):
            self.update(is_finite)


@pytest.mark.parametrize("is_traced", [False, True])
def test_a_guarded_step_applies_only_finite_steps_and_moves_the_schedule_either_way(is_traced):
    settings = LossScaleSettings(initial_scale=4.0, growth_interval=2)

    def variable(value, name, dtype):
        return tf.Variable(value, name=name, dtype=dtype, trainable=False)

    state = create_state(settings, variable)
    step = AddOne(state, settings)
    run = tf.function(step.build_for_all_replicas) if is_traced else step.build_for_all_replicas
    seen = []
    for nonfinite in (0.0, 1.0, 0.0, 0.0, 3.0):
        run(tf.constant(nonfinite))
        seen.append((float(state.scale.numpy()), int(state.good_steps.numpy()), int(state.skipped_steps.numpy()),
                     float(step.target.numpy()), int(step.said.numpy())))
    # finite: 1 good step; skip: halve; finite, finite: the 2nd in a row doubles; skip: halve.
    assert seen == [(4.0, 1, 0, 1.0, 0), (2.0, 0, 1, 1.0, 1), (2.0, 1, 1, 2.0, 1), (4.0, 0, 1, 3.0, 1),
                    (2.0, 0, 2, 3.0, 2)]


@pytest.mark.parametrize("skipped, scale, non_finite_losses, reason", [
    (False, 1.0, 5, None),  # no skip: nothing to judge
    (True, 4.0, 0, None),  # a finite loss and a scale to halve: a smaller scale may help
    (True, 4.0, 1, None),  # one non-finite loss: a bad batch
    (True, 1.0, 0, core.FLOOR_REASON),  # at the floor: none smaller
    (True, 32768.0, 2, core.LOSS_NOT_FINITE),  # the loss comes before any scale: at the second
])
def test_no_scale_helps_after_non_finite_losses_in_a_row_or_at_the_floor(skipped, scale, non_finite_losses, reason):
    assert core.hopeless_reason(skipped=skipped, scale=scale, non_finite_losses=non_finite_losses) == reason


def test_non_finite_losses_are_counted_in_a_row():
    count = tf.constant(0, tf.int64)
    for finite, want in [(0.0, 1), (0.0, 2), (1.0, 0), (0.0, 1)]:
        count = core.count_non_finite_losses(count, tf.constant(finite))
        assert int(count) == want


def test_the_loss_finiteness_a_report_carries():
    assert float(core.is_finite_loss(tf.constant([1.0, 2.0]))) == 1.0
    assert float(core.is_finite_loss(tf.constant([1.0, float("inf")]))) == 0.0
    assert float(core.is_finite_loss(tf.constant(float("nan")))) == 0.0
