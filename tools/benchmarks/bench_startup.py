"""What ENABLE_AUTO_MP costs at interpreter start-up, with the package installed: an empty program's start.

Runs ``python -X importtime -c pass`` several times with the variable unset,
set to 0 and set to 1, and prints the median start-up wall time and the
modules our start-up files imported. Usage: ``python tools/benchmarks/bench_startup.py [-n 20]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

OURS = ("amp_rewrite", "_amp_rewrite_autoload", "_amp_rewrite_import_hook")
VARIABLES = ("ENABLE_AUTO_MP", "TF_ENABLE_AUTO_MIXED_PRECISION")


def start_once(value: str | None) -> tuple[float, dict[str, int]]:
    """Wall seconds of one start-up, and our modules with their cumulative import µs."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    if value is not None:
        env["ENABLE_AUTO_MP"] = value
    begin = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env,
                          capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - begin
    ours = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split("|"))
        if name.split(".")[0] in OURS:
            ours[name] = int(cumulative)
    return seconds, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="start-ups per setting")
    runs = parser.parse_args().n
    for label, value in (("unset", None), ("ENABLE_AUTO_MP=0", "0"), ("ENABLE_AUTO_MP=1", "1")):
        samples = [start_once(value) for _ in range(runs)]
        median_ms = 1000 * statistics.median(s for s, _ in samples)
        modules = samples[-1][1]
        listed = ", ".join(f"{m} {us} us" for m, us in modules.items()) or "none"
        print(f"{label:18} median start-up {median_ms:6.1f} ms; our modules imported: {listed}")


if __name__ == "__main__":
    main()
