"""Checkpoints with and without the loss-scale state restore both ways.

A checkpoint written by a float32 run has no ``amp_loss_scale/*`` keys, and
TensorFlow's ``Saver.restore`` fails on a missing key (NotFoundError).
:func:`tolerant_restore` restores everything else and starts the loss-scale
state from its initial value. The other direction needs nothing: a float32
script's Saver ignores keys it does not ask for. The Saver it restores with
instead is built once per script Saver and kept in the runtime's records
(:attr:`~amp_rewrite.runtime.records.ObjectRecords.restore_savers`).
"""

from __future__ import annotations

import logging

from amp_rewrite import tf_internals
from amp_rewrite.runtime.loss_scale import tf1_optimizer
from amp_rewrite.runtime.records import ObjectRecords

logger = logging.getLogger(__name__)


def tolerant_restore(original, records: ObjectRecords, saver, sess, save_path, *args, **kwargs):
    """``Saver.restore`` that initialises loss-scale variables the checkpoint lacks."""
    state = _state_entries(saver)
    missing = _missing_keys(save_path, state) if state and sess is not None else []
    if not missing:
        return original(saver, sess, save_path, *args, **kwargs)
    logger.info("amp-rewrite: %s has no loss-scale state (%s); starting from the default",
                save_path, ", ".join(missing))
    fallback = records.restore_savers.setdefault(
        saver, lambda: _saver_without_state(saver, sess.graph, [v for _, v in state]))
    result = original(fallback, sess, save_path, *args, **kwargs)
    sess.run([variable.initializer for _, variable in state])
    return result


def _state_entries(saver) -> list:
    """(checkpoint key, variable) for each loss-scale variable this saver saves."""
    var_list = tf_internals.saver_var_list(saver)
    if not var_list:
        return []
    graph = _graph_of(var_list)
    if graph is None:
        return []
    state = {id(v) for v in graph.get_collection(tf1_optimizer.STATE_COLLECTION)}
    if not state:
        return []
    items = var_list.items() if isinstance(var_list, dict) else ((None, v) for v in var_list)
    return [(key if key is not None else v.op.name, v) for key, v in items if id(v) in state]


def _graph_of(var_list):
    values = var_list.values() if isinstance(var_list, dict) else var_list
    for value in values:
        graph = getattr(value, "graph", None)
        if graph is not None:
            return graph
    return None


def _missing_keys(save_path, state) -> list[str]:
    import tensorflow as tf

    try:
        reader = tf.compat.v1.train.NewCheckpointReader(save_path)
    except Exception:  # let the real restore report an unreadable checkpoint
        return []
    return [key for key, _ in state if not reader.has_tensor(key)]


def _saver_without_state(saver, graph, state_variables):
    """A Saver over the same variables minus the loss-scale state."""
    import tensorflow as tf

    skip = {id(v) for v in state_variables}
    var_list, sharded, reshape = tf_internals.saver_settings(saver)
    if isinstance(var_list, dict):
        var_list = {k: v for k, v in var_list.items() if id(v) not in skip}
    else:
        var_list = [v for v in var_list if id(v) not in skip]
    was_finalized = graph.finalized
    if was_finalized:
        tf_internals.unfinalize_graph(graph)  # MonitoredTrainingSession finalizes before restoring
    try:
        with graph.as_default():
            fallback = tf.compat.v1.train.Saver(var_list=var_list, sharded=sharded,
                                                reshape=reshape, allow_empty=True,
                                                name="amp_rewrite_restore")
    finally:
        if was_finalized:
            graph.finalize()
    return fallback
