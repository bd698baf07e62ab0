"""The ``amp-rewrite`` command line: :func:`main` is the console script (``amp-rewrite = amp_rewrite.cli:main``).

Internal apart from :func:`main`: the modules here may move between releases.

- :mod:`~amp_rewrite.cli.main`: the dispatch, exit codes and stderr lines;
- :mod:`~amp_rewrite.cli.args`: the parsers and Config from flags;
- :mod:`~amp_rewrite.cli.commands`: each subcommand (rewrite, explain, doctor, strip);
- :mod:`~amp_rewrite.cli.rewrite`: the in-memory rewrite a command runs;
- :mod:`~amp_rewrite.cli.paths`: the checks on IN and OUT;
- :mod:`~amp_rewrite.cli.process`: exit codes, SIGTERM and TensorFlow's banner.

Imports: the package's modules that load neither NumPy nor TensorFlow (file
I/O, the pipeline, the reports) are imported at the top of each module;
NumPy, and the modules that import it when loaded (validation, strip, the
step timer), inside the function that needs them. So ``--help``,
``--version`` and a usage error start without loading NumPy, and every
command loads TensorFlow only when it first reads a graph.
"""

from amp_rewrite.cli.main import main

__all__ = ["main"]
