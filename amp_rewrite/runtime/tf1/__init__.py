"""The runtime's TF1 paths: sessions that run the rewritten graph, optimizers that scale the loss, Savers.

Internal: nothing here is part of the public API; :func:`amp_rewrite.enable`
installs these patches.

- :mod:`~amp_rewrite.runtime.tf1.session`: the patched ``Session`` and its shadow graph;
- :mod:`~amp_rewrite.runtime.tf1.shadow_graph`: the rewritten copy of a session's graph;
- :mod:`~amp_rewrite.runtime.tf1.loss_scale`: dynamic loss scaling in ``tf.compat.v1.train.Optimizer``;
- :mod:`~amp_rewrite.runtime.tf1.checkpoint`: float32 checkpoints restored into the rewritten graph.
"""
