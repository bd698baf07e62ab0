"""The runtime's TF2 path: traced ``tf.function`` bodies rewritten.

Internal: nothing here is part of the public API; :func:`amp_rewrite.enable`
installs the tracing hook and :func:`amp_rewrite.function` uses it.

- :mod:`~amp_rewrite.runtime.tf2.tracing`: the tracing hook, TensorFlow's callback for each new ConcreteFunction;
- :mod:`~amp_rewrite.runtime.tf2.swap_steps`: the swap of one function, as named steps;
- :mod:`~amp_rewrite.runtime.tf2.swap_records`: what a hook swapped (reports, records, the table);
- :mod:`~amp_rewrite.runtime.tf2.first_call_guard`: a swapped function's first eager call checked,
  and that of a function calling swapped bodies;
- :mod:`~amp_rewrite.runtime.tf2.calls`: what the ``_call_flat`` wrappers share (their protocol, a
  function's names);
- :mod:`~amp_rewrite.runtime.tf2.function_trial`: a rewritten function's first calls alternate its half
  and float32 bodies, and the faster stays;
- :mod:`~amp_rewrite.runtime.tf2.function_trials`: which functions are tried, and their float32 bodies;
- :mod:`~amp_rewrite.runtime.tf2.function_verdicts`: what the trials decided: the tuning cache and the lines;
- :mod:`~amp_rewrite.runtime.tf2.recheck`: a verdict read from the cache checked again in a long run;
- :mod:`~amp_rewrite.runtime.tf2.job_rounds`: a multi-worker job's trial decisions, taken together;
- :mod:`~amp_rewrite.runtime.tf2.step_mixing`: the mixed body of a step on trial, from one profiled
  call of each body: the regions faster in half stay half, the rest float32;
- :mod:`~amp_rewrite.runtime.tf2.concrete`: a ConcreteFunction rewritten and reloaded;
- :mod:`~amp_rewrite.runtime.tf2.fallback`: float32 again when no loss scale helps.

Loss scaling for ``GradientTape`` loops and Keras optimizers is in
:mod:`amp_rewrite.runtime.loss_scale`, below this package.
"""
