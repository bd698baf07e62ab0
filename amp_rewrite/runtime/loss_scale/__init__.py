"""Dynamic loss scaling: one algorithm, and the two ways TF1 and TF2 training hook it in.

Internal: nothing here is part of the public API; :func:`amp_rewrite.enable`
installs these patches for a float16 target (for bfloat16 when asked).

- :mod:`~amp_rewrite.runtime.loss_scale.core`: the state, the schedule and
  the guard both adapters share, and when no scale helps;
- :mod:`~amp_rewrite.runtime.loss_scale.step_writes`: what a skipped step
  wrote besides the optimizer's update (moving statistics, metrics), put
  back, in a TF1 graph and in a rebuilt TF2 body;
- :mod:`~amp_rewrite.runtime.loss_scale.tf1_optimizer`: the TF1 adapter,
  ``tf.compat.v1.train.Optimizer``'s ``compute_gradients`` and
  ``apply_gradients``, a state per graph and the report a session reads;
- :mod:`~amp_rewrite.runtime.loss_scale.tf1_session_log`: what a TF1
  session's reports said, logged as its steps run;
- :mod:`~amp_rewrite.runtime.loss_scale.tf2_install`: the TF2 adapter's
  installer (the tape now, Keras' optimizers once imported);
- :mod:`~amp_rewrite.runtime.loss_scale.tf2_state`: what the TF2 patches
  share (settings, one state per process, the step contexts);
- :mod:`~amp_rewrite.runtime.loss_scale.tf2_tape`: ``tf.GradientTape``
  scaled and unscaled;
- :mod:`~amp_rewrite.runtime.loss_scale.tf2_guarded_apply`: an optimizer's
  apply run only when every gradient is finite, and the line a skip prints;
- :mod:`~amp_rewrite.runtime.loss_scale.tf2_keras_optimizers`: the Keras 3
  and tf_keras optimizers' apply, through the guarded apply;
- :mod:`~amp_rewrite.runtime.loss_scale.unscaled`: a scaled step without its
  scaling, the float32 variant a step trial runs.

This package sits below the runtime's TF1 and TF2 paths and imports nothing
of them: the TF1 sessions read the reports its optimizer builds, and the
TF2 tracing hook is given its :class:`~amp_rewrite.runtime.loss_scale.tf2_state.TF2LossScaling`
(and each body it rebuilds goes through
:func:`~amp_rewrite.runtime.loss_scale.step_writes.restore_in_body`).
Its modules keep the logger names their lines have always carried
(``amp_rewrite.runtime.tf1.loss_scale``, ``amp_rewrite.runtime.tf1.session``,
``amp_rewrite.runtime.tf2.loss_scale``).
"""
