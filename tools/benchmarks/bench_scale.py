"""Scale benchmark: rewrite time, peak memory and time per node from 10k to 1M nodes, beside Grappler's.

Two families of graphs (see ``scale_graphs.py``):
- ``synthetic``: towers of dense blocks written directly as NodeDefs;
- ``inception``: K renamed copies of the tf-slim Inception v3 training graph
  (15,770 nodes each) in one GraphDef.

Each graph is written to a temporary file by one subprocess and measured by
a fresh one, so peak memory is the rewrite's own: the peak resident size
during the rewrite (the kernel's VmHWM, restarted just before it through
``/proc/self/clear_refs``) minus the resident size with the parsed GraphDef
loaded. It is compared with that parsed GraphDef's resident size; the
serialized size is given beside it. The rewrite runs in place, as the CLI
does; ``--copy`` measures the Python API's default instead, which first
copies the GraphDef (about one more GraphDef of memory).
Grappler's ``auto_mixed_precision_cpu`` pass runs in the same process right
after ours, on graphs up to ``--grappler-max`` nodes. Wall and CPU time are
both given: on a shared machine the process's CPU time is the steadier
figure (Grappler's pass is single-threaded too).

Usage: python tools/benchmarks/bench_scale.py [--family synthetic,inception] [--nodes 20000,200000,1000000]
       [--grappler-max 250000] [--flops-max 250000] [--baseline DIR] [--json FILE] [--profile] [--copy]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
INCEPTION_NODES = 15770


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak_rss() -> bool:
    """Restarts the kernel's peak resident size count (VmHWM) from the current size; False if it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmHWM in /proc/self/status")


def make(family: str, nodes: int, path: str) -> None:
    """Writes the graph (``path``) and its fetches (``path.json``)."""
    import scale_graphs

    if family == "synthetic":
        graph_def, fetches = scale_graphs.synthetic_graph(nodes)
    else:
        cache = Path(tempfile.gettempdir()) / "amp_scale_inception_v3.pb"
        if not cache.exists():
            import models

            model = models.tf1_inception_v3_training()
            cache.write_bytes(model.graph_def.SerializeToString())
            Path(str(cache) + ".json").write_text(json.dumps(list(model.fetches)))
        from tensorflow.core.framework import graph_pb2

        base = graph_pb2.GraphDef.FromString(cache.read_bytes())
        copies = max(1, round(nodes / len(base.node)))
        # A GraphDef must serialize to under 2 GB: about 900k nodes of this graph.
        copies = min(copies, (2**31 - 2**26) // base.ByteSize())
        graph_def, fetches = scale_graphs.replicate(base, copies, json.loads(Path(str(cache) + ".json").read_text()))
    Path(path).write_bytes(graph_def.SerializeToString())
    Path(path + ".json").write_text(json.dumps(fetches))


def measure(path: str, grappler: bool, profile: bool, flops: bool, copy: bool) -> dict:
    """Rewrites the graph at ``path`` once with ours, then with Grappler's pass; prints a JSON row."""
    import scale_graphs
    from tensorflow.core.framework import graph_pb2

    import amp_rewrite
    from amp_rewrite import Config, rewrite
    from amp_rewrite.report.grappler import grappler_rewrite

    print(f"amp_rewrite from {Path(amp_rewrite.__file__).parent}", file=sys.stderr)

    config = Config(device_type="CPU")
    warm, warm_fetches = scale_graphs.synthetic_graph(500)
    rewrite(warm, fetches=warm_fetches, config=config)  # load TensorFlow and the op registry first
    fetches = json.loads(Path(path + ".json").read_text())
    rss_before = _rss_mb()
    data = Path(path).read_bytes()
    graph_def = graph_pb2.GraphDef.FromString(data)
    size_mb = len(data) / 2**20
    nodes = len(graph_def.node)
    del data
    rss_loaded = _rss_mb()
    peak_before = _maxrss_mb()
    # The peak from here on is the rewrite's, even when reading the file peaked higher.
    peak_reset = _reset_peak_rss()
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    start, cpu_start = time.perf_counter(), time.process_time()
    kwargs = {} if copy else {"in_place": True}
    result = rewrite(graph_def, fetches=fetches, config=config, **kwargs)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if profile:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    if peak_reset:
        peak_extra = _peak_rss_mb() - rss_loaded
    else:
        peak = _maxrss_mb()
        peak_extra = peak - rss_loaded if peak > peak_before else None
    steps = dict(result.step_seconds)
    start = time.perf_counter()
    _ = result.node_outcomes  # built lazily: this times it
    steps["report"] = time.perf_counter() - start
    if flops:
        start = time.perf_counter()
        _ = result.half_flop_share
        steps["FLOP share"] = time.perf_counter() - start
    row = {
        "nodes": nodes,
        "mode": "copy" if copy else "in place",
        "graphdef_mb": size_mb,
        "graphdef_in_memory_mb": rss_loaded - rss_before,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_extra_mb": peak_extra,
        "casts": len(result.casts),
        "converted": len(result.converted),
        "steps": steps,
    }
    del result
    if grappler:
        original = graph_def if copy else graph_pb2.GraphDef.FromString(Path(path).read_bytes())  # rewritten in place
        cpu_start = time.process_time()
        _, row["grappler_seconds"] = grappler_rewrite(original, fetches)
        row["grappler_cpu_seconds"] = time.process_time() - cpu_start
    print(json.dumps(row))
    return row


def _child(*args: str, baseline: str | None = None) -> str:
    env = dict(os.environ)
    if baseline:
        env["PYTHONPATH"] = baseline + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, __file__, *args], check=True, stdout=subprocess.PIPE, text=True,
                          env=env)
    return done.stdout


def markdown(rows: list[dict]) -> str:
    lines = [
        "| graph | nodes | ours wall / CPU (s) | CPU µs per node | Grappler wall / CPU (s) | ratio (CPU) "
        "| peak extra memory (MB) | GraphDef (MB, serialized / in memory) | peak / GraphDef in memory |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        grappler = r.get("grappler_seconds")
        peak = "n/a" if r["peak_extra_mb"] is None else f"{r['peak_extra_mb']:.0f}"
        times = "n/a" if r["peak_extra_mb"] is None else f"{r['peak_extra_mb'] / r['graphdef_in_memory_mb']:.1f}x"
        theirs = "—" if grappler is None else f"{grappler:.1f} / {r['grappler_cpu_seconds']:.1f}"
        ratio = "—" if grappler is None else f"{r['cpu_seconds'] / r['grappler_cpu_seconds']:.2f}"
        lines.append(
            f"| {r['family']} | {r['nodes']:,} | {r['seconds']:.1f} / {r['cpu_seconds']:.1f} "
            f"| {r['cpu_seconds'] / r['nodes'] * 1e6:.1f} "
            f"| {theirs} | {ratio} | {peak} | {r['graphdef_mb']:.0f} / {r['graphdef_in_memory_mb']:.0f} | {times} |")
    return "\n".join(lines)


def step_table(rows: list[dict]) -> str:
    """Microseconds per node of each step of our pass (and of the report), per graph."""
    steps = list(dict.fromkeys(step for r in rows for step in r["steps"]))
    lines = ["| graph | nodes | " + " | ".join(steps) + " |", "|---|---:|" + "---:|" * len(steps)]
    for r in rows:
        cells = [f"{r['steps'][s] / r['nodes'] * 1e6:.1f}" if s in r["steps"] else "—" for s in steps]
        lines.append(f"| {r['family']} | {r['nodes']:,} | " + " | ".join(cells) + " |")
    return "µs per node of each step:\n\n" + "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="synthetic,inception")
    parser.add_argument("--nodes", default="20000,50000,200000,1000000")
    parser.add_argument("--grappler-max", type=int, default=250000)
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of our pass to stderr")
    parser.add_argument("--baseline", default=None,
                        help="a directory holding another amp_rewrite package (e.g. from git archive) "
                             "to time on the same graphs, right after ours")
    parser.add_argument("--make", nargs=3, metavar=("FAMILY", "NODES", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--measure", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--grappler", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flops", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--copy", action="store_true",
                        help="rewrite a copy (the Python API's default) instead of in place (the CLI)")
    parser.add_argument("--flops-max", type=int, default=250000,
                        help="also time the FLOP share (imports the graph into TensorFlow) up to this many nodes")
    args = parser.parse_args(argv)
    if args.make:
        make(args.make[0], int(args.make[1]), args.make[2])
        return 0
    if args.measure:
        measure(args.measure, args.grappler, args.profile, args.flops, args.copy)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.family.split(","):
            for nodes in (int(n) for n in args.nodes.split(",")):
                path = os.path.join(tmp, f"{family}_{nodes}.pb")
                _child("--make", family, str(nodes), path)
                extra = ["--grappler"] if nodes <= args.grappler_max else []
                extra += ["--profile"] if args.profile else []
                extra += ["--flops"] if nodes <= args.flops_max else []
                extra += ["--copy"] if args.copy else []
                row = json.loads(_child("--measure", path, *extra).strip().splitlines()[-1])
                row["family"] = family
                if args.baseline:
                    base = json.loads(_child("--measure", path, baseline=args.baseline).strip().splitlines()[-1])
                    row["baseline_seconds"] = base["seconds"]
                    print(f"baseline: {base['seconds']:.2f} s", file=sys.stderr)
                rows.append(row)
                print(f"measured {json.dumps(row)}", file=sys.stderr)
                os.unlink(path)
    print(markdown(rows))
    print()
    print(step_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
