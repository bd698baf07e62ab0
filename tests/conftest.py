import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# On a GPU, TensorFlow takes all its memory at the first op unless told to grow: the tests'
# subprocesses would find none left.
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

import pytest  # noqa: E402
from runners import FIXED_SETTINGS, amp_variables  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """The tests marked ``gpu`` are skipped, with the reason, where TensorFlow sees no GPU."""
    marked = [item for item in items if item.get_closest_marker("gpu")]
    reason = why_no_gpu() if marked else None
    if reason:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


def why_no_gpu() -> str | None:
    """Why the ``gpu`` tests cannot run here, or None when TensorFlow sees a GPU."""
    import tensorflow as tf

    if not tf.test.is_built_with_cuda():
        return f"no GPU: TensorFlow {tf.__version__} is built without CUDA (tensorflow-cpu)"
    if not tf.config.list_physical_devices("GPU"):
        return "no GPU: TensorFlow's CUDA build sees none (tf.config.list_physical_devices('GPU') is empty)"
    return None


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
