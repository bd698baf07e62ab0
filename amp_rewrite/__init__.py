"""amp-rewrite: automatic mixed precision for TensorFlow graphs.

``rewrite(graph_def, fetches=[...], target="float16")`` returns a
:class:`RewriteResult` holding the rewritten GraphDef and a report. Importing
this package patches nothing and does not import TensorFlow until a graph is
rewritten.
"""

from amp_rewrite.config import Config
from amp_rewrite.errors import AmpRewriteError, GraphError, InputFileError, ListError, UsageError
from amp_rewrite.op_lists import OpLists, load_lists
from amp_rewrite.pipeline import RewriteResult, rewrite

__all__ = [
    "AmpRewriteError",
    "Config",
    "GraphError",
    "InputFileError",
    "ListError",
    "OpLists",
    "RewriteResult",
    "UsageError",
    "load_lists",
    "rewrite",
]
__version__ = "0.1.0"
