"""The loss-scaling modules log under the names their lines carried before the modules shared one folder.

Scripts and their logging configuration select the runtime's lines by
logger name, so a module that moves keeps its lines' name.
"""

import importlib

import pytest

TF1_OPTIMIZER = "amp_rewrite.runtime.tf1.loss_scale"
TF2_LOSS_SCALE = "amp_rewrite.runtime.tf2.loss_scale"


@pytest.mark.parametrize(("module", "name"), [
    ("tf1_optimizer", TF1_OPTIMIZER),
    ("tf2_state", TF2_LOSS_SCALE),
    ("tf2_guarded_apply", TF2_LOSS_SCALE),
    ("tf2_keras_optimizers", TF2_LOSS_SCALE),
])
def test_a_loss_scaling_module_logs_under_its_old_name(module, name):
    loaded = importlib.import_module(f"amp_rewrite.runtime.loss_scale.{module}")
    assert loaded.logger.name == name
