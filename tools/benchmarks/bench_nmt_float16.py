"""keras-io's English-to-Spanish Transformer, unmodified, trained in float32 and under forced float16.

The example is ``examples/nlp/neural_machine_translation_with_transformer.py``
of keras-team/keras-io (last modified 2022/02/25): a Transformer encoder and
decoder built from tf_keras's ``MultiHeadAttention`` (a padding mask in the
encoder and in the cross-attention, a causal mask in the decoder's
self-attention), trained with ``fit`` and validated each epoch. tf_keras's
masked softmax adds ``(1 - mask) * -1e9`` to the scores in the dtype they were
traced in, float32. This tool does not carry the example: pass the path of a
copy taken from keras-io. It runs in a subprocess per mode, with
``TF_USE_LEGACY_KERAS=1`` (its ``from tensorflow import keras`` is tf_keras):

- ``float32``: none of amp-rewrite's variables;
- ``float16``: ``ENABLE_AUTO_MP=1 AMP_REWRITE_TARGET=float16``, each rewrite
  dumped (``AMP_REWRITE_DUMP_DIR``).

Data. The example downloads ``spa-eng.zip`` with ``keras.utils.get_file``;
here nothing is downloaded. The tool writes a zip of ``spa-eng/spa.txt`` with
``--pairs`` synthetic sentence pairs (a seeded English-like vocabulary, its
Spanish-like words one to one, an adjective after its noun as in Spanish,
lengths of 2 to 12 words, so that padding fills most rows) where
``get_file`` finds a cached file and does not download: ``~/.keras/datasets``,
with ``HOME`` a directory of the tool's own, so a real cached copy is neither
used nor overwritten.

The shim. The example runs as it is, by ``runpy``, in a child process that
first wraps tf_keras's ``Model.fit``: to train ``--epochs`` epochs instead of
the example's 1, to record the loss ``fit`` reports after each batch, and to
stop the script when ``fit`` returns (the example then translates 30 test
sentences eagerly, which amp-rewrite does not rewrite; ``--decode`` runs them).

Reported per mode: the loss after each training batch and each epoch's
``loss`` and ``val_loss``; amp-rewrite's warnings (skipped steps, and whether
a function fell back to float32); and from the dumps, for each rewritten
function, the Casts in its traced graph and in the rewritten one (the float32
run's graph is the traced one), and the nodes put in float16.

Usage::

    python tools/benchmarks/bench_nmt_float16.py PATH/neural_machine_translation_with_transformer.py \\
        [--pairs 1500] [--epochs 2] [--seed 0] [--timeout 1800] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import runpy
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODES = {
    "float32": {},
    "float16": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "float16"},
}
FALLBACK = "runs in float32 from the next call"
SKIPPED = "step skipped"
HALF = 19  # DT_HALF


# ---------------------------------------------------------------- the data

def sentence_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` seeded (English-like, Spanish-like) sentence pairs; the same arguments give the same pairs."""
    rng = random.Random(seed)
    letters = "abcdefghilmnoprstuv"

    def words(n: int, ending: str) -> list[str]:
        made: set[str] = set()
        while len(made) < n:
            made.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 6))) + ending)
        return sorted(made)

    nouns, adjectives, verbs = words(120, ""), words(40, ""), words(40, "")
    spanish = {word: word[::-1] + suffix for group, suffix in ((nouns, "o"), (adjectives, "a"), (verbs, "ar"))
               for word in group}
    pairs = []
    for _ in range(count):
        english, translated = [], []
        for _ in range(rng.randint(1, 4)):  # phrases: noun, or adjective noun (noun adjective in Spanish)
            noun = rng.choice(nouns)
            if rng.random() < 0.4:
                adjective = rng.choice(adjectives)
                english += [adjective, noun]
                translated += [spanish[noun], spanish[adjective]]
            else:
                english.append(noun)
                translated.append(spanish[noun])
            if rng.random() < 0.5:
                verb = rng.choice(verbs)
                english.append(verb)
                translated.append(spanish[verb])
        pairs.append((" ".join(english).capitalize() + ".", " ".join(translated).capitalize() + "."))
    return pairs


def write_dataset(home: Path, pairs: list[tuple[str, str]]) -> Path:
    """Writes ``spa-eng.zip`` (``spa-eng/spa.txt``, a pair a line, tab-separated) where ``get_file`` looks."""
    datasets = home / ".keras" / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    archive = datasets / "spa-eng.zip"
    text = "".join(f"{english}\t{spanish}\n" for english, spanish in pairs)
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr(zipfile.ZipInfo("spa-eng/spa.txt", date_time=(2021, 5, 26, 0, 0, 0)), text)
    return archive


# ---------------------------------------------------------------- the child: the example under the shim

class _Trained(Exception):
    """Raised when ``fit`` returns, to end the example before its decoding."""


def run_child(example: Path, out: Path, epochs: int, decode: bool) -> None:
    """Runs ``example`` with tf_keras's ``Model.fit`` wrapped; writes what ``fit`` reported to ``out``."""
    import tf_keras

    report: dict = {"batch_losses": [], "history": {}}
    original_fit = tf_keras.Model.fit

    class BatchLosses(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            report["batch_losses"].append(float((logs or {}).get("loss", math.nan)))

    def fit(model, *args, **kwargs):
        kwargs["epochs"] = epochs
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), BatchLosses()]
        history = original_fit(model, *args, **kwargs)
        report["history"] = {key: [float(v) for v in values] for key, values in history.history.items()}
        out.write_text(json.dumps(report))
        if not decode:
            raise _Trained
        return history

    tf_keras.Model.fit = fit
    random.seed(0)  # the example shuffles its pairs with the random module
    tf_keras.utils.set_random_seed(0)
    try:
        runpy.run_path(str(example), run_name="__main__")
    except _Trained:
        pass


# ---------------------------------------------------------------- the parent: runs and their report

def run_mode(example: Path, mode: str, home: Path, args) -> dict:
    """One run of the example in ``mode``: what ``fit`` reported, amp-rewrite's lines, and the dumps' counts."""
    workdir = home / mode
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMP_", "ENABLE_AUTO_MP", "TF_AUTO_MIXED"))}
    env.update(MODES[mode], HOME=str(home), KERAS_HOME=str(home / ".keras"), TF_USE_LEGACY_KERAS="1",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    if mode != "float32":
        env["AMP_REWRITE_DUMP_DIR"] = str(workdir / "dump")
    out = workdir / "result.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(example), "--out", str(out),
               "--epochs", str(args.epochs), *(["--decode"] if args.decode else [])]
    done = subprocess.run(command, env=env, cwd=workdir, capture_output=True, text=True, timeout=args.timeout)
    (workdir / "stderr.txt").write_text(done.stderr)
    result = json.loads(out.read_text()) if out.exists() else {}
    result.update(mode=mode, returncode=done.returncode,
                  amp_lines=[line[line.index("amp-rewrite"):] for line in done.stderr.splitlines()
                             if "amp-rewrite" in line])
    if done.returncode:
        result["last_stderr"] = (done.stderr.strip().splitlines() or [""])[-1]
    if (workdir / "dump").is_dir():
        result["rewrites"] = count_dumps(workdir / "dump")
    return result


def cast_and_half_counts(graph_def) -> tuple[int, int]:
    """(Cast nodes, nodes with a float16 type attr) over the main graph and its function library."""
    nodes = [*graph_def.node, *(node for function in graph_def.library.function for node in function.node_def)]
    half = sum(1 for node in nodes if node.op != "Cast" and any(
        value.type == HALF or HALF in value.list.type for value in node.attr.values()))
    return sum(1 for node in nodes if node.op == "Cast"), half


def count_dumps(dump_dir: Path) -> list[dict]:
    """Per dumped rewrite, oldest first: the function it is, Casts before and after, and nodes in float16."""
    from amp_rewrite.graph.io import load_graph_def

    found = []
    for after_path in sorted(dump_dir.glob("graph_*_after.pb"), key=lambda path: path.stat().st_mtime_ns):
        before = load_graph_def(str(after_path).replace("_after.pb", "_before.pb"))
        after = load_graph_def(after_path)
        called = [node.attr["f"].func.name for node in before.node if "f" in node.attr]
        casts_before, _ = cast_and_half_counts(before)
        casts_after, half = cast_and_half_counts(after)
        found.append({"function": called[0] if called else after_path.stem, "casts_traced": casts_before,
                      "casts_rewritten": casts_after, "half_nodes": half})
    return found


def describe(result: dict) -> list[str]:
    lines = [f"{result['mode']}:"]
    if result["returncode"]:
        lines.append(f"  FAILED (exit {result['returncode']}): {result.get('last_stderr', '')}")
    history = result.get("history", {})
    losses = " ".join(f"{loss:.4f}" for loss in result.get("batch_losses", []))
    lines.append(f"  loss after each batch: {losses}")
    for key in ("loss", "val_loss", "accuracy", "val_accuracy"):
        if key in history:
            lines.append(f"  {key} per epoch: {' '.join(f'{v:.4f}' for v in history[key])}")
    for rewrite in result.get("rewrites", []):
        lines.append(f"  rewritten {rewrite['function']}: Casts {rewrite['casts_traced']} traced, "
                     f"{rewrite['casts_rewritten']} rewritten; {rewrite['half_nodes']} nodes in float16")
    fell_back = [line for line in result["amp_lines"] if FALLBACK in line]
    skipped = sum(SKIPPED in line for line in result["amp_lines"])
    lines.append(f"  steps skipped: {skipped}; fell back to float32: {'yes' if fell_back else 'no'}")
    lines += [f"    {line}" for line in fell_back]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example", type=Path, help="keras-io's neural_machine_translation_with_transformer.py")
    parser.add_argument("--pairs", type=int, default=1500, help="synthetic sentence pairs (70%% train, 15%% val)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="seeds the synthetic pairs")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--decode", action="store_true", help="let the example translate its 30 test sentences")
    parser.add_argument("--keep", type=Path, help="keep each run's directory (stderr, dumps) under DIR")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.example, args.out, args.epochs, args.decode)
        return
    if not args.example.is_file():
        sys.exit(f"bench_nmt_float16.py: {args.example}: no such file (pass keras-io's example)")
    home = Path(tempfile.mkdtemp(prefix="nmt-float16-"))
    try:
        write_dataset(home, sentence_pairs(args.pairs, args.seed))
        results = [run_mode(args.example.resolve(), mode, home, args) for mode in MODES]
        print(f"{args.pairs} synthetic pairs, {args.epochs} epochs, {args.example.name}")
        for result in results:
            print("\n".join(describe(result)))
        if args.keep:
            shutil.copytree(home, args.keep, dirs_exist_ok=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
