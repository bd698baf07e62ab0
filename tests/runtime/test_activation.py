"""ENABLE_AUTO_MP: the start-up files, what start-up imports, enable()/disable()."""

import ast
import contextlib
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from runners import clean_env

import _amp_rewrite_autoload as autoload
import _amp_rewrite_import_hook as import_hook
import amp_rewrite
from amp_rewrite import runtime

OWN_VARIABLES = ("ENABLE_AUTO_MP", "TF_ENABLE_AUTO_MIXED_PRECISION")


def python(code, *, flags=(), **env):
    """Runs ``code`` in a fresh interpreter with only ``env`` of our variables set."""
    with tempfile.TemporaryDirectory() as cwd:  # ``-c`` puts it first on sys.path: no checkout there
        done = subprocess.run([sys.executable, *flags, "-c", code], env=clean_env(**env), cwd=cwd,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def imported_at_startup(**env) -> set[str]:
    """Module names ``python -X importtime -c pass`` reports."""
    stderr = python("pass", flags=("-X", "importtime"), **env).stderr
    return {line.split("|")[-1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line} - {"package"}


def test_startup_files_are_installed_in_site_packages():
    site = Path(sysconfig.get_paths()["purelib"])
    pth = (site / "amp_rewrite_autoload.pth").read_text().strip().splitlines()
    assert len(pth) == 1 and pth[0].startswith("import os;")
    assert all(name in pth[0] for name in OWN_VARIABLES)
    start = (site / "amp_rewrite_autoload.start").read_text().split()
    assert start == ["_amp_rewrite_autoload:activate_from_env"]


def test_unset_variable_imports_nothing_at_startup():
    unset = imported_at_startup()
    assert not {m for m in unset if m.split(".")[0] in ("amp_rewrite", "_amp_rewrite_autoload")}
    assert imported_at_startup(ENABLE_AUTO_MP="0") == unset


def test_enabled_startup_imports_only_the_bootstrap():
    enabled = imported_at_startup(ENABLE_AUTO_MP="1")
    assert "_amp_rewrite_autoload" in enabled
    assert not {m for m in enabled if m.startswith(("amp_rewrite", "tensorflow", "numpy"))}


@pytest.mark.parametrize("value, expected", [
    ("1", True), ("true", True), ("TRUE", True), (" yes ", True), ("on", True),
    ("0", False), ("", False), ("false", False), ("2", False),
])
def test_which_values_enable(value, expected):
    assert autoload.is_requested({"ENABLE_AUTO_MP": value}) is expected
    assert autoload.is_requested({"TF_ENABLE_AUTO_MIXED_PRECISION": value}) is expected


def test_patches_apply_when_the_script_imports_tensorflow():
    code = (
        "import sys\n"
        "assert 'amp_rewrite.runtime' not in sys.modules\n"
        "import tensorflow\n"
        "from tensorflow.python.client import session\n"
        "from tensorflow.python.training import optimizer\n"
        "print(hasattr(session.BaseSession.run, '__wrapped__'),"
        " hasattr(optimizer.Optimizer.apply_gradients, '__wrapped__'))\n"
    )
    assert python(code, TF_ENABLE_AUTO_MIXED_PRECISION="1",
                  AMP_REWRITE_TARGET="float16").stdout.split() == ["True", "True"]


def test_disable_before_the_import_leaves_tensorflow_unpatched():
    """``amp_rewrite.disable()`` before ``import tensorflow`` wins over ``ENABLE_AUTO_MP=1``."""
    code = (
        "import amp_rewrite\n"
        "amp_rewrite.disable()\n"
        "import tensorflow\n"
        "from amp_rewrite import runtime\n"
        "from tensorflow.python.client import session\n"
        "print(runtime.is_enabled(), hasattr(session.BaseSession.run, '__wrapped__'))\n"
    )
    assert python(code, ENABLE_AUTO_MP="1", AMP_REWRITE_TARGET="float16").stdout.split() == ["False", "False"]


def test_post_import_hook_fires_once_after_the_module_ran(tmp_path, monkeypatch):
    (tmp_path / "amp_probe_module.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = import_hook.after_import(lambda m: seen.append(m.VALUE), owner="test", name="amp_probe_module")
    assert finder in sys.meta_path
    try:
        import amp_probe_module
    finally:
        import_hook.remove(owner="test", name="amp_probe_module")
    assert seen == [42]
    assert finder not in sys.meta_path
    assert type(amp_probe_module.__loader__).__name__ != "_WrappingLoader"
    assert import_hook.after_import(lambda m: seen.append(0), owner="test", name="amp_probe_module") is None
    assert seen == [42, 0]  # already imported: called at once
    del sys.modules["amp_probe_module"]


def test_hooks_of_two_owners_stack_and_each_owner_removes_only_its_own(tmp_path, monkeypatch):
    (tmp_path / "amp_probe_stacked.py").write_text("import sys\nSEEN = list(sys.amp_probe_events)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    events = []
    monkeypatch.setattr(sys, "amp_probe_events", events, raising=False)

    @contextlib.contextmanager
    def around():
        events.append("enter")
        yield
        events.append("exit")

    import_hook.around_import(around, owner="one", name="amp_probe_stacked")
    import_hook.after_import(lambda m: events.append("after"), owner="two", name="amp_probe_stacked")
    import_hook.after_import(lambda m: events.append("removed"), owner="three", name="amp_probe_stacked")
    import_hook.remove(owner="three", name="amp_probe_stacked")
    assert len(import_hook.pending(owner="one", name="amp_probe_stacked")) == 1
    try:
        import amp_probe_stacked
    finally:
        del sys.modules["amp_probe_stacked"]
    assert amp_probe_stacked.SEEN == ["enter"]  # the module ran inside around()
    assert events == ["enter", "exit", "after"]
    assert not any(isinstance(f, import_hook.PostImportFinder) for f in sys.meta_path)


@pytest.mark.parametrize("is_strict", [False, True])
def test_a_failing_hook_never_breaks_the_import_unless_strict(tmp_path, monkeypatch, capsys, is_strict):
    (tmp_path / "amp_probe_failing.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def fail(module):
        raise ValueError("no such symbol")

    import_hook.after_import(fail, owner="test", name="amp_probe_failing", is_strict=lambda: is_strict)
    try:
        if is_strict:
            with pytest.raises(ValueError, match="no such symbol"):
                import amp_probe_failing  # noqa: F401
        else:
            import amp_probe_failing

            assert amp_probe_failing.VALUE == 1
    finally:
        sys.modules.pop("amp_probe_failing", None)
        import_hook.remove(owner="test", name="amp_probe_failing")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("amp-rewrite")]
    expected = [] if is_strict else ["amp-rewrite: not enabled, patching amp_probe_failing failed: "
                                     "ValueError('no such symbol')"]
    assert lines == expected


def test_the_bootstrap_spells_the_switch_as_the_package_does():
    """The bootstrap cannot import the package at start-up, so it keeps copies; they must not drift."""
    from amp_rewrite import environment

    assert autoload.ENV_NAMES == environment.ENABLE_ENVS
    assert autoload.TRUE_VALUES == environment.TRUE_VALUES
    assert autoload.STRICT_ENV == environment.STRICT_ENV
    pth = (Path(sysconfig.get_paths()["purelib"]) / "amp_rewrite_autoload.pth").read_text()
    assert all(repr(value).replace("'", '"') in pth for value in environment.TRUE_VALUES + environment.ENABLE_ENVS)


def test_the_package_never_imports_the_start_up_bootstrap():
    """The bootstrap imports the runtime when TensorFlow is imported; nothing imports the bootstrap back."""
    package = Path(amp_rewrite.__file__).parent
    importers = [str(path.relative_to(package)) for path in package.rglob("*.py")
                 if "_amp_rewrite_autoload" in _imported_modules(path)]
    assert importers == []
    assert "amp_rewrite" in _imported_modules(Path(autoload.__file__))  # the one direction
    assert not {m for m in _imported_modules(Path(import_hook.__file__)) if m.startswith(("amp_rewrite", "_amp"))}


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_enable_and_disable_are_idempotent():
    from tensorflow.python.client import session
    from tensorflow.python.training import optimizer, saver

    originals = (session.BaseSession.run, optimizer.Optimizer.compute_gradients, saver.Saver.restore)
    try:
        amp_rewrite.enable(target="float16")
        amp_rewrite.enable(target="float16")
        assert runtime.is_enabled()
        assert session.BaseSession.run.__wrapped__ is originals[0]
        assert optimizer.Optimizer.compute_gradients.__wrapped__ is originals[1]
    finally:
        amp_rewrite.disable()
        amp_rewrite.disable()
    assert not runtime.is_enabled()
    assert (session.BaseSession.run, optimizer.Optimizer.compute_gradients,
            saver.Saver.restore) == originals


def test_runtime_lines_print_once_after_absl_installs_its_handler():
    code = (
        "import tensorflow as tf\n"
        "from absl import logging as absl_logging\n"
        "absl_logging.use_absl_handler()  # what app.run does\n"
        "tf.compat.v1.disable_eager_execution()\n"
        "with tf.compat.v1.Session() as sess:\n"
        "    sess.run(tf.matmul(tf.ones([2, 2]), tf.ones([2, 2])) + 1.0)\n"
    )
    stderr = python(code, ENABLE_AUTO_MP="1", AMP_REWRITE_TARGET="float16").stderr
    ours = [line for line in stderr.splitlines() if "amp-rewrite" in line or "converted" in line]
    assert len(ours) == 1 and "to float16" in ours[0] and "float16 was requested" in ours[0], ours


def test_the_ledger_undoes_every_change_newest_first_even_past_a_failing_one():
    from amp_rewrite.runtime.ledger import Ledger

    class Owner:
        def greet(self, who):
            return f"hello {who}"

    original = Owner.__dict__["greet"]
    undone = []
    ledger = Ledger()
    ledger.install("first", Owner, "greet", lambda orig, self, who: orig(self, who.upper()))
    ledger.record("second", "a list", lambda: undone.append("second"))
    ledger.install("first", Owner, "greet", lambda orig, self, who: orig(self, who) + "!")

    def broken():
        raise OSError("cannot undo")

    ledger.record("third", "a file", broken)
    assert Owner().greet("ann") == "hello ANN!"
    assert Owner.greet.__wrapped__.__wrapped__ is original
    greet = f"{Owner.__qualname__}.greet"
    assert greet.endswith("<locals>.Owner.greet")
    assert [(e.name, e.where) for e in ledger.installed()] == [
        ("first", greet), ("second", "a list"), ("first", greet), ("third", "a file")]
    assert [e.where for e in ledger.installed("second")] == ["a list"]
    with pytest.raises(OSError, match="cannot undo"):
        ledger.uninstall_all()
    assert Owner.__dict__["greet"] is original and undone == ["second"]
    assert ledger.installed() == []
    ledger.uninstall_all()  # again: nothing left to undo
    assert Owner.__dict__["greet"] is original


def test_a_patch_called_from_a_tf_function_runs_as_written_not_converted_by_autograph():
    import tensorflow as tf

    from amp_rewrite.runtime.ledger import Ledger

    class Owner:
        def double(self, x):
            return 2 * x

    def replacement(original, owner, x):
        # Python's ``if`` on a symbolic tensor: AutoGraph would turn it into a tf.cond.
        return original(owner, x) if x > 0 else x

    ledger = Ledger()
    ledger.install("test", Owner, "double", replacement)
    try:
        with pytest.raises(TypeError, match="tf.Tensor"):
            tf.function(lambda x: Owner().double(x))(tf.constant(3.0))
        assert float(Owner().double(tf.constant(3.0))) == 6.0  # eager: a plain Python call
    finally:
        ledger.uninstall_all()


def test_disable_puts_back_every_attribute_enable_patched():
    import keras  # noqa: F401  (Keras 3 is patched at once when it is already imported)
    from keras.src.optimizers import base_optimizer
    from keras.src.optimizers import loss_scale_optimizer as keras_lso
    from tensorflow.python.client import session
    from tensorflow.python.eager import backprop
    from tensorflow.python.eager.polymorphic_function import transform
    from tensorflow.python.training import optimizer, saver
    from tensorflow.python.training.experimental import loss_scale_optimizer as tf1_lso

    patched = {
        session.BaseSession: {"__init__", "run", "make_callable", "_make_callable_from_options",
                              "partial_run_setup", "partial_run", "close"},
        optimizer.Optimizer: {"compute_gradients", "apply_gradients"},
        saver.Saver: {"restore"},
        tf1_lso.MixedPrecisionLossScaleOptimizer: {"__init__"},
        backprop.GradientTape: {"gradient", "jacobian", "batch_jacobian"},
        base_optimizer.BaseOptimizer: {"apply", "scale_loss"},
        keras_lso.LossScaleOptimizer: {"scale_loss", "__init__"},
    }
    runtime.disable()
    before = {owner: dict(vars(owner)) for owner in patched}
    callbacks, meta_path = list(transform.CONCRETE_FUNCTION_CALLBACKS), list(sys.meta_path)
    for _ in range(2):
        try:
            amp_rewrite.enable(target="float16")
            for owner, attrs in patched.items():
                changed = {k for k, v in vars(owner).items() if before[owner].get(k) is not v}
                assert changed == attrs, owner
                assert all(vars(owner)[a].__wrapped__ is before[owner][a] for a in attrs)
            assert len(transform.CONCRETE_FUNCTION_CALLBACKS) == len(callbacks) + 1
            where = {e.where for e in runtime.installed_changes()}
            ledger = runtime._ACTIVE.ledger  # pylint: disable=protected-access
            assert {f"{o.__qualname__}.{a}" for o, attrs in patched.items() for a in attrs} <= where
        finally:
            amp_rewrite.disable()
        for owner in patched:
            assert vars(owner).keys() == before[owner].keys()
            assert all(vars(owner)[k] is v for k, v in before[owner].items()), owner
        assert transform.CONCRETE_FUNCTION_CALLBACKS == callbacks and sys.meta_path == meta_path
        assert ledger.installed() == [] and not runtime.is_enabled()
