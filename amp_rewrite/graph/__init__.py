"""The graph machinery every step shares: reading a GraphDef and viewing it typed.

Internal: nothing here is part of the public API (that is :mod:`amp_rewrite`'s
face); modules may move between releases.

- :mod:`~amp_rewrite.graph.facts`: facts read off a GraphDef (dtype numbers,
  input strings, sinks, a node's callees, the nodes of the main graph and the
  function bodies as one list);
- :mod:`~amp_rewrite.graph.op_registry`: TensorFlow's OpDefs and kernels, the
  device type graphs run on;
- :mod:`~amp_rewrite.graph.op_ports`, :mod:`~amp_rewrite.graph.instances`,
  :mod:`~amp_rewrite.graph.data_edges`, :mod:`~amp_rewrite.graph.vertex_dtypes`,
  :mod:`~amp_rewrite.graph.names` and :mod:`~amp_rewrite.graph.typed_graph`:
  the typed view, one vertex per node and type attribute;
- :mod:`~amp_rewrite.graph.functions`: function instances written back into the library,
  and the synthetic call that reaches an entry function;
- :mod:`~amp_rewrite.graph.tensors`: Const values read and converted;
- :mod:`~amp_rewrite.graph.importable`: whether TensorFlow can import a graph;
- :mod:`~amp_rewrite.graph.flops`: MatMul/Conv FLOPs;
- :mod:`~amp_rewrite.graph.io`: GraphDef and SavedModel files.

Nothing here imports the painting, the runtime or the command line.
"""
