import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from runners import FIXED_SETTINGS, amp_variables  # noqa: E402


@pytest.fixture(autouse=True)
def _no_amp_env(monkeypatch):
    """Tests start without any variable amp-rewrite or TensorFlow's AMP reads, whatever the shell exported."""
    for name in amp_variables(os.environ):
        monkeypatch.delenv(name)
    # A runtime enabled from the environment times no step (nor writes a cache in the home directory):
    # the op lists alone decide, as in the suite's subprocesses (runners.FIXED_SETTINGS).
    monkeypatch.setenv("AMP_REWRITE_TUNE", FIXED_SETTINGS["AMP_REWRITE_TUNE"])


@pytest.fixture
def amp_runtime():
    """Starts the runtime with ``settings`` (default: an empty environment's); it is off before and after."""
    from amp_rewrite import runtime
    from amp_rewrite.runtime.settings import RuntimeSettings

    def start(settings=None):
        runtime.enable(settings=settings or RuntimeSettings(target="float16"))

    runtime.disable()
    yield start
    runtime.disable()
