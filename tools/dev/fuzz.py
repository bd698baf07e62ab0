"""Long fuzz runs of the rewrite: random graphs, the same properties as tests/test_fuzz.py.

    python tools/dev/fuzz.py --graphs 10000 [--seed S] [--out DIR] [--jobs 2] [--known PROPERTY]...
    python tools/dev/fuzz.py --replay SEED        # rebuild one graph and print what fails

Graph ``k`` of a run is built from the integer seed ``S + k``, so any graph
can be rebuilt alone with ``--replay``. Graphs are checked in worker
processes; a graph whose check does not finish within ``--timeout`` seconds
counts as a failure (``hang``) and its worker is replaced. Every failing
graph is saved to ``--out`` as ``seed-N.pbtxt`` (the input GraphDef) with
``seed-N.txt`` (recipe, fetches, configuration and the failures).

The exit status is 1 when a graph fails a property not named by ``--known``,
else 0. ``--known`` lets a long run look past a failure already understood
(and reproduced in tests/test_fuzz_regressions.py) while still counting it.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
TESTS = Path(__file__).resolve().parents[2] / "tests"
logger = logging.getLogger("fuzz")


# -- worker side ------------------------------------------------------------------


def _strategies():
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import graph_strategies

    return graph_strategies


def check_seed(seed: int, out_dir: Path | None, max_steps: int) -> dict:
    """Builds and checks the graph of ``seed``; saves it when it fails. Returns a summary."""
    gs = _strategies()
    recipe = gs.recipe_from_seed(seed, max_steps=max_steps)
    try:
        built = gs.build(recipe)
    except Exception as exc:  # noqa: BLE001 - a recipe that cannot be built is a harness bug
        return {"seed": seed, "failures": {"harness: build": f"{type(exc).__name__}: {exc}"}, "nodes": 0}
    verdict = gs.check_rewrite(built)
    if not verdict.ok and out_dir is not None:
        save_failure(out_dir, seed, built, verdict.failures)
    return {"seed": seed, "failures": verdict.failures, "nodes": len(built.graph_def.node),
            "converted": verdict.converted, "casts": verdict.casts, "worst_ratio": verdict.worst_ratio,
            "elements": verdict.elements, "loose": verdict.loose, "optimized": verdict.optimized}


def save_failure(out_dir: Path, seed: int, built, failures: dict[str, str]) -> Path:
    """Writes ``seed-N.pbtxt`` (the input graph) and ``seed-N.txt`` (how to reproduce it)."""
    from google.protobuf import text_format

    out_dir.mkdir(parents=True, exist_ok=True)
    graph_path = out_dir / f"seed-{seed}.pbtxt"
    graph_path.write_text(text_format.MessageToString(built.graph_def))
    lines = [f"seed: {seed}", f"replay: python tools/dev/fuzz.py --replay {seed}",
             f"config: {built.config}", f"fetches: {built.rewrite_fetches}",
             f"tensors fetched: {built.fetches}", f"recipe: {built.recipe!r}", "failures:"]
    lines += [f"  {name}: {detail}" for name, detail in failures.items()]
    (out_dir / f"seed-{seed}.txt").write_text("\n".join(lines) + "\n")
    return graph_path


def worker_main(conn, out_dir: str | None, max_steps: int) -> None:
    """Checks the seeds the parent sends until it sends None."""
    logging.basicConfig(level=logging.ERROR)
    target = Path(out_dir) if out_dir else None
    while True:
        seed = conn.recv()
        if seed is None:
            return
        conn.send(check_seed(seed, target, max_steps))


# -- parent side --------------------------------------------------------------------


@dataclass
class Tally:
    """Counts over a run."""

    tried: int = 0
    failed: int = 0
    unknown_failed: int = 0
    by_property: Counter = field(default_factory=Counter)
    failing_seeds: list[int] = field(default_factory=list)
    nodes: int = 0
    converted: int = 0
    casts: int = 0
    worst_ratio: float = 0.0
    elements: int = 0
    loose: int = 0
    optimized: int = 0

    def add(self, summary: dict, known: set[str]) -> None:
        self.tried += 1
        self.nodes += summary.get("nodes", 0)
        self.converted += summary.get("converted", 0)
        self.casts += summary.get("casts", 0)
        self.worst_ratio = max(self.worst_ratio, summary.get("worst_ratio", 0.0))
        self.elements += summary.get("elements", 0)
        self.loose += summary.get("loose", 0)
        self.optimized += int(summary.get("optimized", False))
        failures = summary["failures"]
        if failures:
            self.failed += 1
            self.failing_seeds.append(summary["seed"])
            self.by_property.update(failures.keys())
            if set(failures) - known:
                self.unknown_failed += 1

    def line(self, total: int, elapsed: float) -> str:
        rate = self.tried / elapsed if elapsed > 0 else 0.0
        props = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_property.items())) or "none"
        return (f"graphs {self.tried}/{total}  failing {self.failed} ({props})  "
                f"{rate:.1f} graphs/s  worst |got-want|/tolerance {self.worst_ratio:.3f}")


class Worker:
    """One checking process and the seed it is working on."""

    def __init__(self, ctx, out_dir: Path, max_steps: int):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_main, args=(child, str(out_dir), max_steps), daemon=True)
        self.process.start()
        child.close()
        self.seed: int | None = None
        self.started = 0.0

    def give(self, seed: int) -> None:
        self.seed, self.started = seed, time.monotonic()
        self.conn.send(seed)

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()


def run(args) -> int:
    """Checks ``args.graphs`` graphs; prints progress and a summary; returns the exit status."""
    ctx = multiprocessing.get_context("spawn")
    out_dir = Path(args.out)
    known = set(args.known)
    seeds = iter(range(args.seed, args.seed + args.graphs))
    workers = [Worker(ctx, out_dir, args.max_steps) for _ in range(args.jobs)]
    tally = Tally()
    start = last_report = time.monotonic()
    for worker in workers:
        _give_next(worker, seeds)
    while any(w.seed is not None for w in workers):
        busy = [w for w in workers if w.seed is not None]
        ready = wait([w.conn for w in busy], timeout=1.0)
        for worker in busy:
            if worker.conn in ready:
                try:
                    summary = worker.conn.recv()
                except EOFError:
                    summary = {"seed": worker.seed, "failures": {"crash": "the checking process died"}}
                    worker = _replace(workers, worker, ctx, out_dir, args)
                _record(tally, summary, known)
                _give_next(worker, seeds)
            elif time.monotonic() - worker.started > args.timeout:
                seed = worker.seed
                _record(tally, {"seed": seed, "failures": {"hang": f"no verdict after {args.timeout} s"}}, known)
                _save_hang(out_dir, seed, args)
                worker = _replace(workers, worker, ctx, out_dir, args)
                _give_next(worker, seeds)
        now = time.monotonic()
        if now - last_report >= args.report_every:
            print(tally.line(args.graphs, now - start), flush=True)
            last_report = now
    for worker in workers:
        worker.stop()
    elapsed = time.monotonic() - start
    print(tally.line(args.graphs, elapsed), flush=True)
    print(f"done: {tally.tried} graphs ({tally.nodes} nodes, {tally.converted} converted, {tally.casts} casts) "
          f"in {elapsed:.0f} s; {tally.failed} failing, {tally.unknown_failed} on properties not --known",
          flush=True)
    print(f"{tally.optimized} graphs ran with Grappler, the others (v1 control flow, or Grappler wrong "
          f"on the float32 graph) without", flush=True)
    if tally.elements:
        print(f"tolerance above a tenth of the output's magnitude for {tally.loose / tally.elements:.1%} "
              f"of {tally.elements} fetched values", flush=True)
    if tally.failing_seeds:
        print(f"failing seeds (first 20): {tally.failing_seeds[:20]}; graphs saved in {out_dir}", flush=True)
    return 1 if tally.unknown_failed else 0


def _give_next(worker: Worker, seeds) -> None:
    seed = next(seeds, None)
    if seed is None:
        worker.seed = None
    else:
        worker.give(seed)


def _record(tally: Tally, summary: dict, known: set[str]) -> None:
    tally.add(summary, known)
    if summary["failures"]:
        names = ", ".join(summary["failures"])
        print(f"seed {summary['seed']}: FAILED {names}", flush=True)


def _replace(workers: list[Worker], worker: Worker, ctx, out_dir: Path, args) -> Worker:
    worker.process.kill()
    worker.process.join(timeout=5)
    workers.remove(worker)
    fresh = Worker(ctx, out_dir, args.max_steps)
    workers.append(fresh)
    return fresh


def _save_hang(out_dir: Path, seed: int, args) -> None:
    """Builds the hanging graph here (building never runs it) and saves it."""
    gs = _strategies()
    built = gs.build(gs.recipe_from_seed(seed, max_steps=args.max_steps))
    save_failure(out_dir, seed, built, {"hang": f"no verdict after {args.timeout} s"})


def replay(seed: int, max_steps: int) -> int:
    """Rebuilds one graph, prints its recipe and every failed property."""
    gs = _strategies()
    built = gs.build(gs.recipe_from_seed(seed, max_steps=max_steps))
    print(f"recipe: {built.recipe!r}")
    print(f"config: {built.config}; fetches: {built.rewrite_fetches}; {len(built.graph_def.node)} nodes")
    verdict = gs.check_rewrite(built)
    print(f"converted {verdict.converted}, casts {verdict.casts}, "
          f"worst |got-want|/tolerance {verdict.worst_ratio:.3f}")
    print(verdict.explain() if not verdict.ok else "all properties hold")
    return 0 if verdict.ok else 1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, default=1000, help="number of graphs to check")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first graph")
    parser.add_argument("--out", default="fuzz-failures", help="directory for failing graphs")
    parser.add_argument("--jobs", type=int, default=1, help="checking processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a graph counts as hung")
    parser.add_argument("--max-steps", type=int, default=16, help="top-level steps per recipe, at most")
    parser.add_argument("--known", action="append", default=[], metavar="PROPERTY",
                        help="a property whose failures are counted but do not fail the run")
    parser.add_argument("--report-every", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--replay", type=int, metavar="SEED", help="check one graph and explain")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replay is not None:
        return replay(args.replay, args.max_steps)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
