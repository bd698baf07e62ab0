"""A skipped step leaves the variables it wrote as they were: moving statistics, metric state.

The guard (:class:`~amp_rewrite.runtime.loss_scale.core.GuardedStep`) skips
the optimizer's update, but a training step writes other variables outside
it: a batch norm's moving mean and variance as the forward pass normalises
the batch (Keras 3's ``BatchNormalization``, TF1's ``UPDATE_OPS``), and
Keras's metrics (the loss mean, AUC's confusion counts) after the update.
Kept, a skipped step counts in them, and one whose forward pass overflowed
half leaves inf or NaN in the moving statistics, which every later
evaluation reads. So a skipped step puts back each floating variable it
assigned, besides the loss scale's own:

- **Snapshot.** Each such variable is read before any op of the step may
  change it. A resource variable's read shares its buffer, and a write
  after it makes a new one (copy on write), so a step that is not skipped
  copies no more than its own writes did, and the values never leave the
  device.
- **Restore.** Where the guard skipped, each snapshot is assigned back, in
  a cond on its decision; a step that is not skipped runs no assignment.

Which writes: dense assignments (:data:`WRITE_OPS`) of a floating variable.
Integer variables are counters (an iteration count, a random seed's state)
and go on counting; a scatter writes a few rows of what is usually a large
buffer (an embedding table, a queue), which a snapshot would copy whole
every step, so it is kept as written. A variable the step may initialise
(read by ``VarIsInitializedOp``) is left alone: it may have no value to
read before the step.

Two adapters, as for the guard:

- TF2, :func:`restore_in_body`: a rebuilt body of a rewritten
  ``tf.function`` holding a guard (its cond named
  :data:`~amp_rewrite.runtime.loss_scale.core.DECISION`), for the writes at
  the body's top level; the restore runs after every op touching them (the
  metrics Keras updates after the optimizer too), as a control output. A
  write in a function the body calls (a cond's branch, a loop's body), or in
  a body without the guard's cond, is not seen.
- TF1, :func:`snapshot_writes_before`: at graph construction, the writes
  the gradients depend on (a batch norm's ``UPDATE_OPS`` under
  ``control_dependencies`` around ``minimize``); the restore runs in the
  guard's skip branch, which follows them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.runtime.loss_scale.core import APPLY_SCOPE, DECISION, RESTORE_SCOPE, SCOPE

#: Dense assignments of a whole variable: resource variables', then reference variables'.
WRITE_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                       "Assign", "AssignAdd", "AssignSub"})
#: Ops that read a resource variable without changing it.
READ_OPS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VarIsInitializedOp",
                      "VariableShape"})
IF_OPS = frozenset({"If", "StatelessIf"})
INITIALISED_CHECK = "VarIsInitializedOp"
# The loss scale's own ops: its state, the guard's update, the restore itself (names uniquified with _N).
_LOSS_SCALE_OP = re.compile(rf"(^|/)({SCOPE}|{APPLY_SCOPE}|{RESTORE_SCOPE})(_\d+)?/")
_DECISION_OP = re.compile(rf"(^|/){APPLY_SCOPE}(_\d+)?/{DECISION}(_\d+)?$")


@dataclass
class Written:
    """A variable a step writes: its handle (or reference), dtype, and the step's ops that may change it."""

    variable: Any
    dtype: Any
    changers: list = field(default_factory=list)

    @property
    def is_resource(self) -> bool:
        return self.variable.dtype.name == "resource"


def written_variables(ops: Iterable) -> list[Written]:
    """The floating variables that ``ops`` (a step's) assign densely, besides the loss scale's, in order.

    Each comes with the ops among ``ops`` that may change it, the snapshot's
    successors: every op taking a resource handle that does not only read
    it (a call or a cond it goes into included); a reference variable's
    assignments.
    """
    ops = list(ops)
    found: dict[Any, Written] = {}
    for op in ops:
        if op.type in WRITE_OPS and not _LOSS_SCALE_OP.search(op.name):
            dtype = op.get_attr("dtype" if op.type.endswith("VariableOp") else "T")
            if dtype.is_floating:
                variable = _root(op.inputs[0])
                found.setdefault(variable.ref(), Written(variable, dtype))
    initialised_here = set()
    for op in ops:
        for tensor in op.inputs:
            entry = found.get(_root(tensor).ref())
            if entry is None:
                continue
            if op.type == INITIALISED_CHECK:
                initialised_here.add(entry.variable.ref())
            elif op.type in WRITE_OPS or (entry.is_resource and op.type not in READ_OPS and op.type != "Identity"):
                entry.changers.append(op)
    return [entry for key, entry in found.items() if key not in initialised_here]


def _root(tensor):
    """The variable ``tensor`` stands for: the tensor an ``Identity`` chain of a resource handle starts from."""
    while tensor.dtype.name == "resource" and tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor


def take_snapshots(written: list[Written]) -> list:
    """A read of each variable, ordered before the ops that may change it (call under the step's graph)."""
    import tensorflow as tf

    snapshots = []
    for entry in written:
        if entry.is_resource:
            snapshot = tf.raw_ops.ReadVariableOp(resource=entry.variable, dtype=entry.dtype)
        else:
            # A reference variable is updated in place: a read would share the buffer, so copy it.
            snapshot = tf.raw_ops.Snapshot(input=entry.variable)
        for op in dict.fromkeys(entry.changers):
            tf_internals.add_control_input(op, snapshot.op)
        snapshots.append(snapshot)
    return snapshots


def assign_snapshots(written: list[Written], snapshots: list):
    """One op assigning each snapshot back to its variable."""
    import tensorflow as tf

    assignments = []
    for entry, snapshot in zip(written, snapshots):
        if entry.is_resource:
            assignments.append(tf.raw_ops.AssignVariableOp(resource=entry.variable, value=snapshot))
        else:
            assignments.append(tf.compat.v1.assign(entry.variable, snapshot).op)
    return tf.group(*assignments)


# --- TF2: a rebuilt body --------------------------------------------------------------------------


def restore_in_body(graph) -> bool:
    """Makes the FuncGraph ``graph`` (a rebuilt body) put back what a skipped step wrote; whether it did.

    The step skipped when any guard's cond at the body's top level did. The
    restore runs after every op that touches a written variable and is a
    control output, so the function does not return before it.
    """
    import tensorflow as tf

    ops = graph.get_operations()
    decisions = [op.inputs[0] for op in ops if op.type in IF_OPS and _DECISION_OP.search(op.name)]
    if not decisions:
        return False
    written = written_variables(ops)
    if not written:
        return False
    touching = _touching(ops, written)
    with graph.as_default(), tf.name_scope(RESTORE_SCOPE):
        snapshots = take_snapshots(written)
        with tf.control_dependencies(touching):
            skipped = tf.logical_not(tf.reduce_all(tf.stack(decisions)))
            restore = tf.cond(skipped, lambda: _restored(written, snapshots), lambda: tf.constant(False))
    graph.control_outputs.append(restore.op)
    return True


def _touching(ops: list, written: list[Written]) -> list:
    """Every op among ``ops`` that reads or writes one of the written variables."""
    variables = {entry.variable.ref() for entry in written}
    return [op for op in ops if any(_root(t).ref() in variables for t in op.inputs)]


def _restored(written: list[Written], snapshots: list):
    import tensorflow as tf

    with tf.control_dependencies([assign_snapshots(written, snapshots)]):
        return tf.constant(True)


# --- TF1: at graph construction -----------------------------------------------------------------------


def snapshot_writes_before(tensors: Iterable) -> Callable[[], Any] | None:
    """Snapshots the variables written by the ops ``tensors`` depend on; returns their restore, or None.

    Call it before the guard, in the step's graph; the restore (an op) goes
    in the guard's skip branch, which depends on ``tensors`` and so runs
    after those writes. Writes inside a v1 loop or cond are left out: their
    frame cannot be ordered from outside it.
    """
    import tensorflow as tf

    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return None
    written = written_variables(op for op in ancestors(tensors) if not _in_v1_frame(op))
    if not written:
        return None
    graph = tensors[0].graph
    with graph.control_dependencies(None), tf.name_scope(RESTORE_SCOPE):
        snapshots = take_snapshots(written)

    def restore():
        with tf.name_scope(RESTORE_SCOPE):
            return assign_snapshots(written, snapshots)

    return restore


def ancestors(elements: Iterable) -> list:
    """Every op the given tensors or ops depend on (themselves included), through data and control edges."""
    seen: dict[str, Any] = {}
    stack = [getattr(element, "op", element) for element in elements]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen[op.name] = op
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return list(seen.values())


def _in_v1_frame(op) -> bool:
    """Whether ``op`` runs inside a v1 while loop or cond."""
    return tf_internals.control_flow_context(op) is not None
