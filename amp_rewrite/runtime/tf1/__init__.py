"""The runtime's TF1 paths: sessions that run the rewritten graph, and Savers that restore float32 checkpoints.

Internal: nothing here is part of the public API; :func:`amp_rewrite.enable`
installs these patches.

- :mod:`~amp_rewrite.runtime.tf1.session`: the patched ``Session`` and its shadow graph;
- :mod:`~amp_rewrite.runtime.tf1.shadow_graph`: the rewritten copy of a session's graph;
- :mod:`~amp_rewrite.runtime.tf1.checkpoint`: float32 checkpoints restored into the rewritten graph.

The optimizers' loss scaling, and the lines a session logs from its reports,
are in :mod:`amp_rewrite.runtime.loss_scale`, below this package.
"""
