"""The runtime's TF2 paths: traced ``tf.function`` bodies rewritten, and loss scaling for tapes and Keras.

Internal: nothing here is part of the public API; :func:`amp_rewrite.enable`
installs these hooks and :func:`amp_rewrite.function` uses the tracing one.

- :mod:`~amp_rewrite.runtime.tf2.tracing`: the tracing callback that swaps in rewritten bodies;
- :mod:`~amp_rewrite.runtime.tf2.swap`: the swap of one function, as named steps;
- :mod:`~amp_rewrite.runtime.tf2.swaps`: what a hook swapped (reports, records, the table);
- :mod:`~amp_rewrite.runtime.tf2.concrete`: a ConcreteFunction rewritten and reloaded;
- :mod:`~amp_rewrite.runtime.tf2.fallback`: float32 again when no loss scale helps;
- :mod:`~amp_rewrite.runtime.tf2.loss_scale_state`, :mod:`~amp_rewrite.runtime.tf2.loss_scale`,
  :mod:`~amp_rewrite.runtime.tf2.tape`, :mod:`~amp_rewrite.runtime.tf2.guard` and
  :mod:`~amp_rewrite.runtime.tf2.keras_optimizers`: dynamic loss scaling for
  ``GradientTape`` loops and Keras optimizers.
"""
