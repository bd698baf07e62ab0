"""The runtime's error and its one-line reasons: one class, one first-line helper."""

import amp_rewrite
from amp_rewrite.errors import AmpRewriteError, RuntimeRewriteError, first_line
from amp_rewrite.runtime.tf1 import session
from amp_rewrite.runtime.tf1.session import fallback


def test_the_runtime_error_is_one_class_under_the_package_base():
    assert issubclass(RuntimeRewriteError, AmpRewriteError)
    assert amp_rewrite.RuntimeRewriteError is RuntimeRewriteError
    assert session.RuntimeRewriteError is RuntimeRewriteError  # the path scripts already import


def test_first_line_of_an_empty_message_can_name_its_own_text():
    assert first_line(ValueError(""), with_type=True) == "ValueError"
    blank = ValueError("  \n ")
    assert first_line(blank, with_type=True, if_empty="(no message)") == "ValueError: (no message)"
    assert first_line(KeyError(), if_empty="KeyError()") == "KeyError()"


def test_first_line_skips_boilerplate_lines_unless_all_are():
    exc = RuntimeError("Graph execution error:\n\n  Detected at node 'x'\n  bad shape [2] vs [3]  \nmore")
    assert first_line(exc, skipping=("Graph execution error", "Detected at node")) == "bad shape [2] vs [3]"
    assert first_line(exc) == "Graph execution error:"
    assert first_line(RuntimeError("Detected at node 'y'"), skipping=("Detected",)) == "Detected at node 'y'"


def test_a_tensorflow_error_line_names_the_message_and_the_node():
    text = ("Graph execution error:\n\nDetected at node 'dense/MatMul' defined at (most recent call last):\n"
            "Node: 'dense/MatMul'\nMatrix size-incompatible: In[0]: [2,3], In[1]: [4,5]\n"
            "\t [[{{node dense/MatMul}}]]")
    error_line = fallback.error_line
    assert error_line(ValueError(text)) == (
        "ValueError: Matrix size-incompatible: In[0]: [2,3], In[1]: [4,5] (node dense/MatMul)")
    plain = ValueError("Matrix size-incompatible at node dense/MatMul\nmore")
    assert error_line(plain) == "ValueError: Matrix size-incompatible at node dense/MatMul"
    assert error_line(ValueError()) == "ValueError: ValueError()"
