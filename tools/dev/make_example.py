"""Writes the small MLP example graph as a binary GraphDef.

Usage (from the repository root)::

    python tools/dev/make_example.py [OUTPUT]

OUTPUT defaults to ``tools/example/mlp.pb`` under the repository root. The
bytes are deterministic, so re-running the script leaves the file unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TOOLS_DIR.parent
DEFAULT_OUTPUT = TOOLS_DIR / "example" / "mlp.pb"
MODELS_DIR = TOOLS_DIR / "benchmarks"

# tools/ is not a package: make the benchmarks' models.py importable as a top-level module.
if str(MODELS_DIR) not in sys.path:
    sys.path.insert(0, str(MODELS_DIR))

import models  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Builds the MLP graph and writes it to the output path.

    Args:
        argv: Command-line arguments (defaults to ``sys.argv[1:]``).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "output",
        nargs="?",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"where to write the GraphDef (default: {DEFAULT_OUTPUT.relative_to(REPO_ROOT)})",
    )
    args = parser.parse_args(argv)

    model = models.small_mlp_inference()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(models.graph_def_bytes(model.graph_def))
    print(f"wrote {args.output}")
    print(f"nodes: {len(model.graph_def.node)}")
    print(f"fetch: {', '.join(model.fetches)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
