"""Random valid float32 TensorFlow graphs, and the properties every rewrite of them must have.

A graph is described by a :class:`Recipe` (plain data: a list of steps), drawn
through a :class:`Chooser`. The same recipe code serves two drivers: the
hypothesis strategy :func:`recipes` (for pytest, with shrinking) and
:class:`RandomChooser` (for ``tools/dev/fuzz.py``, where each graph is reproduced
from one integer seed). :func:`build` turns a recipe into a ``tf.Graph`` built
with ``tf.compat.v1`` ops, and at the same time computes, in float64 NumPy,
the exact value of every tensor and a bound on how far a half-precision
evaluation of it may stray. :func:`check_rewrite` rewrites the graph and
checks the properties.

Every value the steps pass around is a float32 ``[8, 8]`` matrix; a step may
reshape, convolve or split it internally. Steps read earlier values by
``pick``: 0 is the most recent value, 1 the one before, and so on (modulo the
number of values), so any list of steps builds a valid graph. Besides the op
steps there are sources (placeholders, Consts, resource and ref variables,
Casts from bool and int), v1 while loops and conds (nested one level), steps
pinned to a GPU (left alone by a CPU rewrite, run with soft placement), and
nodes to preserve.

Properties (:func:`check_rewrite`): the rewrite succeeds and leaves its input
alone; it gives the same bytes twice and the same conversions for the nodes
in reverse order; rewriting its output changes nothing; the structural
postconditions of :mod:`amp_rewrite.paint.checks` hold (every edge joins one dtype,
every Cast it adds changes the type, no new half → float32 → half Cast pair
appears, fetched outputs keep their dtype); the report names every node, and so
does the HTML page drawn from it; allow-list ops convert unless fetched, preserved or pinned, those never change, and
deny-list ops do not convert;
the output imports and runs, and fetched
tensors keep their dtype and agree with float32 within the model below.

Tolerance model (running error analysis). For each tensor ``y`` we carry
``err(y)``, an elementwise bound on ``|y_computed - y_exact|`` that holds
whichever ops the rewrite puts in half: every op is assumed to possibly run
in half, with unit roundoff ``u`` (2^-11 for float16, 2^-8 for bfloat16) and
an absolute floor ``eta`` for subnormals and flush-to-zero. Rules, with
``|a|`` the exact magnitudes:

- a value is rounded to half at most once, where it is produced or where a
  Cast takes it to half, so each arithmetic op adds ``k * u * (|y| + err)``
  (k = 1 for add/mul, 4 for transcendental functions whose half kernels may
  lose a few ulps); ops that only move or select values add nothing;
- ``a + b``: ``err(a) + err(b)``; ``a * b``: ``|a| err(b) + |b| err(a) + err(a) err(b)``;
- MatMul/BatchMatMul/Conv2D with K-term sums: the same product rule through
  the matrix product, plus ``(K + 1) u (|A| + err) @ (|B| + err)`` for accumulation;
- Sum/Mean of K terms: the sum of errors plus ``(K + 1) u`` times the sum of magnitudes;
- Lipschitz functions use their Lipschitz constant on the error interval:
  tanh 1, sigmoid 1/4, relu/abs/maxpool 1, exp ``exp(x) expm1(err)``,
  log ``-log1p(-err/x)``, sqrt ``sqrt(x) - sqrt(x - err)``, softmax
  ``s expm1(2 max err)`` plus ``(4M + K + 4) u s`` for its half evaluation;
- ``Select(a > b, a, b)`` is within ``err(a) + err(b) + max(err(a), err(b))``
  even when the comparison flips, because it can only flip when ``a`` and
  ``b`` are that close.

Loops apply the body's rules once per iteration. The float32 graph obeys the
same bound with ``u = 2^-24``, so a rewritten output ``got`` and the float32
output ``want`` must satisfy ``|got - want| <= err_half + err_single``, where
``err_single <= (2^-24 / u) err_half``. We also check ``|want - exact| <=
err_half``, which catches a wrong NumPy model here rather than blaming the
rewrite. The bound is relative to the magnitudes of the operands, not of the
result, so cancellation (``a - b`` with ``a ≈ b``) cannot cause false alarms.
An element whose bound reaches past the largest half value (errors that
compound, such as squaring a matrix 24 times) is not judged: there the half
result may legitimately be anything, inf included.

fp16-unsafe by construction, and how the recipes stay clear of it:

- values are rescaled by powers of two (exact, by at most 2^8 upwards) to
  stay within [2^-3, 4] at the top level and within 16 inside loop bodies, so
  no half op overflows;
- Exp only reads ``tanh(x)``; Log reads ``|x| + 1`` and Sqrt ``|x| + 1/4``;
- comparisons that decide a Select or a Cast read fed placeholders whose
  values are multiples of 1/64 in [-1, 1] (exact in both half types) against
  exact thresholds, or are the ``Select(a > b, a, b)`` form above;
- a Const holding 1e5 (outside float16) only feeds Mean, whose float32 result
  is exact; a second such Const feeds a MatMul whose result nothing reads,
  which stays float32 for float16 (it reads a value beyond float16's range)
  and goes half for bfloat16;
- level UNSAFE_FORCE_ALL is not drawn: it converts Mean and would overflow.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from hypothesis import strategies as st

from amp_rewrite import Config, rewrite
from amp_rewrite.paint.checks import half_round_trips, violations  # noqa: F401 - half_round_trips is used by tests

logger = logging.getLogger(__name__)

tf1 = tf.compat.v1
N = 8  # every value is an N x N float32 matrix
F32, F16, BF16 = (tf.float32.as_datatype_enum, tf.float16.as_datatype_enum,
                  tf.bfloat16.as_datatype_enum)
INIT_OP = "init"


# -- choosers: where the random choices come from -----------------------------


class Chooser:
    """The source of every choice a recipe makes; subclasses draw integers."""

    def integer(self, lo: int, hi: int) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def weighted(self, table: tuple[tuple[str, int], ...]) -> str:
        """One name of ``table``, with probability proportional to its weight (the first when shrunk)."""
        total = sum(w for _, w in table)
        k = self.integer(0, total - 1)
        for name, weight in table:
            if k < weight:
                return name
            k -= weight
        raise AssertionError("unreachable")


class HypothesisChooser(Chooser):
    """Draws through hypothesis, so failing recipes shrink."""

    def __init__(self, draw):
        self._draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))


class RandomChooser(Chooser):
    """Draws from ``random.Random(seed)``: one seed reproduces one recipe exactly."""

    def __init__(self, seed: int):
        self._random = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self._random.randint(lo, hi)


# -- recipes -----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a recipe.

    Attributes:
        kind: what the step builds (a key of :data:`STEP_KINDS`).
        picks: the values it reads, 0 being the most recent.
        seed: seeds the step's constants and fed values.
        option: selects a variant (axis, op flavour, predicate kind).
        count: loop trip count.
        body: loop body, or the true branch of a cond.
        orelse: the false branch of a cond.
        device: a device to pin the step's ops to ("" for none).
    """

    kind: str
    picks: tuple[int, ...] = ()
    seed: int = 0
    option: int = 0
    count: int = 0
    body: tuple[Step, ...] = ()
    orelse: tuple[Step, ...] = ()
    device: str = ""

    def __repr__(self) -> str:
        parts = [repr(self.kind), f"picks={self.picks}"]
        for name in ("seed", "option", "count", "device"):
            if getattr(self, name):
                parts.append(f"{name}={getattr(self, name)}")
        for name in ("body", "orelse"):
            if getattr(self, name):
                parts.append(f"{name}={getattr(self, name)!r}")
        return f"Step({', '.join(parts)})"


@dataclass(frozen=True)
class Recipe:
    """A whole graph: steps, what to fetch, and the rewrite's target and level.

    ``fetches`` holds (pick among computed values, mode), mode being
    ``"identity"`` (fetch an Identity of it), ``"direct"`` (fetch the tensor
    itself) or ``"shape"`` (fetch its int32 Shape). ``preserve`` names nodes
    the rewrite must leave alone: a pick below 16 picks a computed value,
    a larger one any node of the graph (loop and cond internals included).
    """

    steps: tuple[Step, ...]
    fetches: tuple[tuple[int, str], ...]
    target: str = "float16"
    level: str = "DEFAULT"
    preserve: tuple[int, ...] = ()


# (kind, number of picks, weight at top level); bodies use the weight too when allowed there.
_KINDS: tuple[tuple[str, int, int], ...] = (
    ("matmul", 2, 6), ("matmul_const", 1, 4), ("conv", 1, 3), ("bmm", 2, 3),
    ("add", 2, 3), ("sub", 2, 2), ("mul", 2, 2), ("bias_add", 1, 2),
    ("tanh", 1, 2), ("sigmoid", 1, 2), ("softmax", 1, 2), ("log_pos", 1, 1), ("sqrt_pos", 1, 1),
    ("relu", 1, 3), ("identity", 1, 1), ("neg", 1, 1), ("reshape", 1, 2), ("transpose", 1, 2),
    ("maxpool", 1, 2), ("split_concat", 1, 1), ("concat_split", 2, 2), ("pack_unpack", 2, 2),
    ("select_max", 2, 2), ("shape_reshape", 2, 1), ("size_scale", 2, 1),
    ("exp_tanh", 1, 2), ("center_mean", 1, 2), ("sum_add", 2, 1), ("half_roundtrip", 1, 2),
    ("add_n", 3, 1), ("avg_pool", 1, 1), ("einsum", 2, 1), ("depthwise", 1, 1), ("batch_norm", 1, 2),
    ("gather", 1, 1), ("identity_n", 1, 1),
    # top level only from here on
    ("select_bool", 2, 1), ("big_const", 1, 1), ("dead_big_const", 1, 1),
    ("placeholder", 0, 2), ("const", 0, 2), ("resource_var", 0, 1), ("ref_var", 0, 2),
    ("bool_cast", 0, 1), ("while", 3, 3), ("cond", 2, 3),
)
ARITY = {kind: arity for kind, arity, _ in _KINDS}
_TOP_TABLE = tuple((kind, weight) for kind, _, weight in _KINDS)
_BODY_TABLE = tuple((kind, weight) for kind, _, weight in _KINDS[:_KINDS.index(("select_bool", 2, 1))])
_NESTING_TABLE = _BODY_TABLE + (("while", 2), ("cond", 2))  # inside a loop or branch, one level down
_DEVICES = (("", 14), ("/device:GPU:0", 1), ("/device:CPU:0", 1))
TARGETS = (("float16", 4), ("bfloat16", 1))
LEVELS = (("DEFAULT", 6), ("TENSOR_CORES_ONLY", 1), ("TREAT_INFER_AS_DENY", 1))


def make_recipe(chooser: Chooser, *, max_steps: int = 16) -> Recipe:
    """Draws a recipe: 1 to ``max_steps`` top-level steps and 1 to 3 fetches."""
    steps = tuple(_make_step(chooser, _TOP_TABLE, depth=0) for _ in range(chooser.integer(1, max_steps)))
    fetches = tuple((chooser.integer(0, 7), chooser.weighted((("identity", 3), ("direct", 2), ("shape", 1))))
                    for _ in range(chooser.integer(1, 3)))
    target, level = chooser.weighted(TARGETS), chooser.weighted(LEVELS)
    preserved = int(chooser.weighted((("0", 4), ("1", 1), ("2", 1))))
    preserve = tuple(chooser.integer(0, 63) for _ in range(preserved))
    return Recipe(steps, fetches, target=target, level=level, preserve=preserve)


def _make_step(chooser: Chooser, table, depth: int) -> Step:
    kind = chooser.weighted(table)
    picks = tuple(chooser.integer(0, 7) for _ in range(ARITY[kind]))
    seed = chooser.integer(0, 2**16)
    option = chooser.integer(0, 7)
    device = chooser.weighted(_DEVICES)
    inner = _NESTING_TABLE if depth == 0 else _BODY_TABLE
    if kind == "while":
        body = tuple(_make_step(chooser, inner, depth + 1) for _ in range(chooser.integer(1, 3)))
        return Step(kind, picks, seed, option, count=chooser.integer(1, 3), body=body, device=device)
    if kind == "cond":
        true_branch = tuple(_make_step(chooser, inner, depth + 1) for _ in range(chooser.integer(0, 2)))
        false_branch = tuple(_make_step(chooser, inner, depth + 1) for _ in range(chooser.integer(0, 2)))
        return Step(kind, picks, seed, option, body=true_branch, orelse=false_branch, device=device)
    return Step(kind, picks, seed, option, device=device)


@st.composite
def recipes(draw, max_steps: int = 16) -> Recipe:
    """Hypothesis strategy for :class:`Recipe`."""
    return make_recipe(HypothesisChooser(draw), max_steps=max_steps)


def recipe_from_seed(seed: int, *, max_steps: int = 16) -> Recipe:
    """The recipe a seed stands for (used by the long-run fuzzer)."""
    return make_recipe(RandomChooser(seed), max_steps=max_steps)


# -- the precision model -------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """Unit roundoff ``u``, absolute rounding floor ``eta`` and largest finite value of a floating type."""

    u: float
    eta: float
    max: float


# float16: subnormal spacing 2^-24; bfloat16: TensorFlow's CPU kernels flush below 2^-126.
PRECISIONS = {"float16": Precision(2.0**-11, 2.0**-25, 65504.0),
              "bfloat16": Precision(2.0**-8, 2.0**-126, 3.38e38)}
SINGLE = Precision(2.0**-24, 2.0**-126, 3.4e38)
FLOAT16 = PRECISIONS["float16"]


class Pair(NamedTuple):
    """A tensor's exact value and the elementwise bound on its error."""

    ref: np.ndarray
    err: np.ndarray


def rounded(y: np.ndarray, err: np.ndarray, prec: Precision, k: float = 1.0) -> np.ndarray:
    """``err`` plus ``k`` roundings of a value within ``err`` of ``y``."""
    return err + k * (prec.u * (np.abs(y) + err) + prec.eta)


def product_error(a: Pair, b: Pair, prod: Callable, prec: Precision, terms: int) -> np.ndarray:
    """Error of a bilinear ``prod`` (elementwise or matrix product) of ``a`` and ``b``.

    ``terms`` is the number of products each output sums; their accumulation
    adds ``(terms + 1)`` roundings of the magnitude sum.
    """
    abs_a, abs_b = np.abs(a.ref), np.abs(b.ref)
    first = prod(abs_a, b.err) + prod(a.err, abs_b) + prod(a.err, b.err)
    return first + (terms + 1) * (prec.u * prod(abs_a + a.err, abs_b + b.err) + prec.eta)


def moved(fn: Callable) -> Callable:
    """A pair function for ops that only move, select or max values: apply ``fn`` to both."""
    return lambda *pairs: Pair(fn(*(p.ref for p in pairs)), fn(*(p.err for p in pairs)))


def conv_patches(x: np.ndarray) -> np.ndarray:
    """im2col for a 3x3 SAME, stride-1 NHWC convolution: [N*H*W, 9*C]."""
    n, h, w, c = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = [padded[:, i:i + h, j:j + w, :] for i in range(3) for j in range(3)]
    return np.concatenate(cols, axis=-1).reshape(n * h * w, 9 * c)


def max_pool_2x2(x: np.ndarray, fill: float) -> np.ndarray:
    """2x2 max pool, stride 1, SAME padding (TensorFlow pads after), padding with ``fill``."""
    _, h, w, _ = x.shape
    padded = np.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)), constant_values=fill)
    return np.maximum.reduce([padded[:, i:i + h, j:j + w, :] for i in (0, 1) for j in (0, 1)])


def softmax_rows(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


# -- symbolic values: a TF tensor and the NumPy function of its exact value ----


@dataclass(eq=False)
class Sym:
    """A tensor of the graph being built, with how to compute its :class:`Pair`.

    Attributes:
        tensor: the TensorFlow tensor.
        fn: maps the input pairs to this tensor's pair; None for loop inputs,
            whose pair is given per iteration.
        inputs: the Syms ``fn`` reads.
        bound: a sound bound on the exact value's magnitude, used to keep
            half values far from overflow.
        source: a placeholder, constant or variable read (never fetched).
    """

    tensor: object
    fn: Callable[..., Pair] | None
    inputs: tuple[Sym, ...] = ()
    bound: float = 1.0
    source: bool = False


def evaluate(sym: Sym, env: dict) -> Pair:
    """The pair of ``sym``, memoised in ``env`` (which also supplies loop inputs)."""
    stack = [sym]
    while stack:
        top = stack[-1]
        if top in env:
            stack.pop()
            continue
        missing = [s for s in top.inputs if s not in env]
        if missing:
            stack.extend(missing)
            continue
        if top.fn is None:
            raise KeyError(f"no value supplied for loop input {top.tensor}")
        with np.errstate(invalid="ignore", over="ignore"):
            ref, err = top.fn(*(env[s] for s in top.inputs))
        # 0 * inf is nan: an unbounded error stays unbounded.
        env[top] = Pair(ref, np.where(np.isnan(err), np.inf, err))
        stack.pop()
    return env[sym]


# -- building -----------------------------------------------------------------


@dataclass
class Built:
    """A graph built from a recipe, ready to rewrite and run.

    Attributes:
        recipe: what it was built from.
        graph: the ``tf.Graph`` (used to run the float32 reference).
        graph_def: its GraphDef.
        fetches: tensor names to fetch.
        rewrite_fetches: node names to pass to ``rewrite`` (fetches plus the init op).
        feeds: placeholder tensor name → value.
        init: the variable initializer's name, or None.
        expected: per fetch, its exact value and half error bound.
        config: the rewrite configuration.
    """

    recipe: Recipe
    graph: tf.Graph
    graph_def: object
    fetches: list[str]
    rewrite_fetches: list[str]
    feeds: dict[str, np.ndarray]
    init: str | None
    expected: list[Pair]
    config: Config


class Scope:
    """The values visible to the steps of one block (top level, loop body or cond branch).

    ``pred`` is the (tensor, value) a cond nested in this block branches on:
    a placeholder fed outside the enclosing loop or cond.
    """

    def __init__(self, values: list[Sym], *, top_level: bool, env: dict, pred=None):
        self.values = values
        self.top_level = top_level
        self.env = env
        self.pred = pred

    def pick(self, k: int) -> Sym:
        return self.values[-1 - (k % len(self.values))]


class Builder:
    """Interprets a recipe into TF ops and Syms. One instance builds one graph."""

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.prec = PRECISIONS[recipe.target]
        self.graph = tf.Graph()
        self.feeds: dict[str, np.ndarray] = {}
        self.variables: list = []
        self.counter = 0

    # -- helpers shared by the step kinds --

    def sym(self, tensor, fn, inputs, bound, *, source=False) -> Sym:
        return Sym(tensor, fn, tuple(inputs), float(bound), source)

    def const(self, values: np.ndarray, name: str | None = None) -> Sym:
        values = values.astype(np.float32)
        tensor = tf.constant(values, name=name)
        exact = values.astype(np.float64)
        pair = Pair(exact, rounded(exact, np.zeros_like(exact), self.prec))
        return self.sym(tensor, lambda: pair, (), np.abs(exact).max(initial=0.0), source=True)

    def weights(self, seed: int, shape, scale: float) -> Sym:
        values = np.random.default_rng(seed).uniform(-scale, scale, shape)
        return self.const(values)

    def fed(self, seed: int, shape, dtype=tf.float32, name: str = "x") -> tuple[object, np.ndarray]:
        """A placeholder with its feed: multiples of 1/64 in [-1, 1] (exact in half), or booleans."""
        rng = np.random.default_rng(seed)
        name = f"{name}{len(self.feeds)}"
        if dtype == tf.bool:
            value = rng.random(shape) < 0.5
        else:
            value = (rng.integers(-64, 65, shape) / 64.0).astype(np.float32)
        tensor = tf1.placeholder(dtype, shape, name=name)
        self.feeds[tensor.name] = value
        return tensor, value

    def unary(self, fn_tf, a: Sym, fn_pair, bound) -> Sym:
        return self.sym(fn_tf(a.tensor), fn_pair, (a,), bound)

    def scaled(self, a: Sym, scale: float) -> Sym:
        """``a`` times an exact power of two."""
        c = tf.constant(np.float32(scale))
        prec = self.prec
        return self.sym(tf.math.multiply(a.tensor, c),
                        lambda p: Pair(p.ref * scale, rounded(p.ref * scale, p.err * scale, prec)),
                        (a,), a.bound * scale)

    def reshaped(self, a: Sym, shape) -> Sym:
        return self.sym(tf.reshape(a.tensor, shape), moved(lambda v: v.reshape(shape)), (a,), a.bound)

    # -- normalisation keeps every value inside the half range --

    def normalise_top(self, a: Sym, env: dict) -> Sym:
        """Scales a top-level value by a power of two so its largest magnitude lies in [1/8, 4].

        Values below 2^-8 are left alone: scaling them up would need a factor
        beyond the half range, and they hold little but rounding noise in half.
        """
        peak = float(np.abs(evaluate(a, env).ref).max(initial=0.0))
        if peak > 4.0:
            a = self.scaled(a, 2.0 ** -math.ceil(math.log2(peak / 2.0)))
        elif 2.0 ** -8 <= peak < 0.125:
            a = self.scaled(a, 2.0 ** math.floor(math.log2(1.0 / peak)))
        a.bound = float(np.abs(evaluate(a, env).ref).max(initial=0.0))
        return a

    def normalise_static(self, a: Sym) -> Sym:
        """Scales a loop-body or branch value whose static bound exceeds 16."""
        if a.bound > 16.0:
            a = self.scaled(a, 2.0 ** -math.ceil(math.log2(a.bound / 4.0)))
        return a

    # -- blocks --

    def run_steps(self, steps: tuple[Step, ...], scope: Scope) -> list[Sym]:
        """Applies ``steps`` in ``scope``; returns the values they produced."""
        produced = []
        for step in steps:
            self.counter += 1
            with tf.name_scope(f"s{self.counter}_{step.kind}"), tf.device(step.device or None):
                inputs = [scope.pick(k) for k in step.picks]
                outs = STEP_KINDS[step.kind](self, step, inputs, scope)
                normalise = (lambda s: self.normalise_top(s, scope.env)) if scope.top_level \
                    else self.normalise_static
                outs = [normalise(s) for s in outs]
            scope.values.extend(outs)
            produced.extend(outs)
        return produced


def build(recipe: Recipe) -> Built:
    """Builds the graph of ``recipe``: a tf.Graph, its fetches and feeds, and the expected outputs."""
    b = Builder(recipe)
    env: dict = {}
    with b.graph.as_default(), _v1_control_flow():
        first, _ = b.fed(0, (N, N))
        x0 = b.sym(first, lambda: Pair(b.feeds[first.name].astype(np.float64), np.zeros((N, N))),
                   (), 1.0, source=True)
        scope = Scope([x0], top_level=True, env=env)
        computed = b.run_steps(recipe.steps, scope)
        candidates = [s for s in computed if not s.source] or [x0]
        fetches, expected = _fetches(recipe, candidates, env)
        init = None
        if b.variables:
            init = tf1.variables_initializer(b.variables, name=INIT_OP).name
    graph_def = b.graph.as_graph_def()
    preserve = _preserved(recipe, candidates, graph_def)
    rewrite_fetches = [name.removesuffix(":0") for name in fetches] + ([init] if init else [])
    config = Config(device_type="CPU", target=recipe.target, level=recipe.level, preserve=tuple(preserve))
    return Built(recipe, b.graph, graph_def, fetches, rewrite_fetches, b.feeds, init, expected, config)


def _preserved(recipe: Recipe, candidates: list[Sym], graph_def) -> list[str]:
    names = set()
    for k in recipe.preserve:
        if k < 16:
            names.add(candidates[-1 - (k % len(candidates))].tensor.op.name)
        else:
            names.add(graph_def.node[(k * 7919) % len(graph_def.node)].name)
    return sorted(names)


def _fetches(recipe: Recipe, computed: list[Sym], env: dict) -> tuple[list[str], list[Pair]]:
    names, expected = [], []
    for k, (pick, mode) in enumerate(recipe.fetches):
        sym = computed[-1 - (pick % len(computed))]
        pair = evaluate(sym, env)
        if mode == "identity":
            tensor = tf.identity(sym.tensor, name=f"fetch{k}")
        elif mode == "shape":
            tensor = tf.raw_ops.Shape(input=sym.tensor, name=f"fetch{k}")
            pair = Pair(np.array(pair.ref.shape, dtype=np.float64), np.zeros(len(pair.ref.shape)))
        else:
            tensor = sym.tensor
        if tensor.name in names:
            continue
        names.append(tensor.name)
        expected.append(pair)
    return names, expected


class _v1_control_flow:
    """Builds tf.compat.v1 while_loop/cond as Enter/Merge/Switch/NextIteration while active."""

    def __enter__(self):
        from tensorflow.python.ops import control_flow_util

        self._module = control_flow_util
        self._old = control_flow_util.ENABLE_CONTROL_FLOW_V2
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = False

    def __exit__(self, *exc):
        self._module.ENABLE_CONTROL_FLOW_V2 = self._old
        return False


# -- the step kinds -------------------------------------------------------------
# Each takes (builder, step, input Syms, scope) and returns the new Syms.


def _matmul(b: Builder, step: Step, ins, scope):
    a, c = ins
    transpose = bool(step.option & 1)
    prec = b.prec

    def fn(pa, pc):
        if transpose:
            pc = Pair(pc.ref.T, pc.err.T)
        return Pair(pa.ref @ pc.ref, product_error(pa, pc, np.matmul, prec, pa.ref.shape[-1]))

    tensor = tf.linalg.matmul(a.tensor, c.tensor, transpose_b=transpose)
    return [b.sym(tensor, fn, (a, c), N * a.bound * c.bound)]


def _matmul_const(b: Builder, step: Step, ins, scope):
    w = b.weights(step.seed, (N, N), 0.5)
    return _matmul(b, replace(step, option=step.option & 1), [ins[0], w], scope)


def _conv(b: Builder, step: Step, ins, scope):
    (a,) = ins
    x = b.reshaped(a, (1, 4, 4, 4))
    w = b.weights(step.seed, (3, 3, 4, 4), 1.0 / 3.0)
    prec = b.prec

    def fn(px, pw):
        cols = Pair(conv_patches(px.ref), conv_patches(px.err))
        mat = Pair(pw.ref.reshape(36, 4), pw.err.reshape(36, 4))
        y = (cols.ref @ mat.ref).reshape(1, 4, 4, 4)
        return Pair(y, product_error(cols, mat, np.matmul, prec, 36).reshape(1, 4, 4, 4))

    conv = b.sym(tf.nn.conv2d(x.tensor, w.tensor, strides=1, padding="SAME"), fn, (x, w), 12 * a.bound)
    return [b.reshaped(conv, (N, N))]


def _bmm(b: Builder, step: Step, ins, scope):
    a, c = ins
    x, y = b.reshaped(a, (4, 4, 4)), b.reshaped(c, (4, 4, 4))
    adjoint = bool(step.option & 1)
    prec = b.prec

    def fn(px, py):
        if adjoint:
            py = Pair(np.swapaxes(py.ref, -1, -2), np.swapaxes(py.err, -1, -2))
        return Pair(px.ref @ py.ref, product_error(px, py, np.matmul, prec, 4))

    tensor = tf.raw_ops.BatchMatMulV2(x=x.tensor, y=y.tensor, adj_y=adjoint)
    return [b.reshaped(b.sym(tensor, fn, (x, y), 4 * a.bound * c.bound), (N, N))]


def _add_like(sign: float, ops: tuple):
    def kind(b: Builder, step: Step, ins, scope):
        a, c = ins
        prec = b.prec
        op = ops[step.option % len(ops)]

        def fn(pa, pc):
            y = pa.ref + sign * pc.ref
            return Pair(y, rounded(y, pa.err + pc.err, prec))

        return [b.sym(op(x=a.tensor, y=c.tensor), fn, (a, c), a.bound + c.bound)]

    return kind


def _mul(b: Builder, step: Step, ins, scope):
    a, c = ins
    prec = b.prec

    def fn(pa, pc):
        return Pair(pa.ref * pc.ref, product_error(pa, pc, np.multiply, prec, 0))

    return [b.sym(tf.raw_ops.Mul(x=a.tensor, y=c.tensor), fn, (a, c), a.bound * c.bound)]


def _bias_add(b: Builder, step: Step, ins, scope):
    (a,) = ins
    bias = b.const(np.random.default_rng(step.seed).uniform(-0.5, 0.5, N))
    prec = b.prec

    def fn(pa, pb):
        y = pa.ref + pb.ref
        return Pair(y, rounded(y, pa.err + pb.err, prec))

    return [b.sym(tf.raw_ops.BiasAdd(value=a.tensor, bias=bias.tensor), fn, (a, bias), a.bound + bias.bound)]


def _elementwise(fn_tf, fn_ref, lipschitz: float, bound: Callable[[float], float], k: float = 4.0):
    """A unary kind for a smooth function with a global Lipschitz constant."""
    def kind(b: Builder, step: Step, ins, scope):
        prec = b.prec

        def fn(pa):
            y = fn_ref(pa.ref)
            return Pair(y, rounded(y, lipschitz * pa.err, prec, k))

        return [b.unary(fn_tf, ins[0], fn, bound(ins[0].bound))]

    return kind


def _softmax(b: Builder, step: Step, ins, scope):
    prec = b.prec

    def fn(pa):
        s = softmax_rows(pa.ref)
        grow = np.expm1(2.0 * pa.err.max(axis=-1, keepdims=True))
        peak = (np.abs(pa.ref) + pa.err).max(axis=-1, keepdims=True)
        work = (4.0 * peak + N + 4.0) * prec.u * s * (1.0 + grow) + (N + 4.0) * prec.eta
        return Pair(s, s * grow + work)

    return [b.unary(tf.nn.softmax, ins[0], fn, 1.0)]


def _positive_then(b: Builder, ins, offset: float, fn_tf, fn_ref, err_fn):
    """``fn(|a| + offset)``: Abs and an Add feed a function defined only for positive inputs."""
    prec = b.prec
    shifted = b.sym(tf.math.add(tf.math.abs(ins[0].tensor), np.float32(offset)),
                    lambda p: Pair(np.abs(p.ref) + offset, rounded(np.abs(p.ref) + offset, p.err, prec)),
                    (ins[0],), ins[0].bound + offset)

    def fn(p):
        y = fn_ref(p.ref)
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.where(p.err < p.ref, err_fn(p.ref, p.err), np.inf)
        return Pair(y, rounded(y, spread, prec, 4.0))

    return [b.unary(fn_tf, shifted, fn, fn_ref(shifted.bound))]


def _log_pos(b: Builder, step: Step, ins, scope):
    return _positive_then(b, ins, 1.0, tf.math.log, np.log, lambda x, e: -np.log1p(-e / x))


def _sqrt_pos(b: Builder, step: Step, ins, scope):
    return _positive_then(b, ins, 0.25, tf.math.sqrt, np.sqrt, lambda x, e: np.sqrt(x) - np.sqrt(x - e))


def _exp_tanh(b: Builder, step: Step, ins, scope):
    prec = b.prec
    (bounded,) = _elementwise(tf.math.tanh, np.tanh, 1.0, lambda m: 1.0)(b, step, ins, scope)

    def fn(p):
        y = np.exp(p.ref)
        return Pair(y, rounded(y, y * np.expm1(p.err), prec, 4.0))

    return [b.unary(tf.math.exp, bounded, fn, math.e)]


def _moved_unary(fn_tf, fn_np):
    def kind(b: Builder, step: Step, ins, scope):
        return [b.unary(fn_tf, ins[0], moved(fn_np), ins[0].bound)]

    return kind


def _neg(b: Builder, step: Step, ins, scope):
    return [b.unary(tf.math.negative, ins[0], lambda p: Pair(-p.ref, p.err), ins[0].bound)]


_RESHAPES = ((4, 16), (2, 32), (64,), (16, 4))


def _reshape(b: Builder, step: Step, ins, scope):
    inner = b.reshaped(ins[0], _RESHAPES[step.option % len(_RESHAPES)])
    return [b.reshaped(inner, (N, N))]


def _maxpool(b: Builder, step: Step, ins, scope):
    x = b.reshaped(ins[0], (1, N, N, 1))

    def fn(p):
        return Pair(max_pool_2x2(p.ref, -np.inf), max_pool_2x2(p.err, 0.0))

    pooled = b.unary(lambda t: tf.nn.max_pool2d(t, 2, 1, "SAME"), x, fn, x.bound)
    return [b.reshaped(pooled, (N, N))]


def _split_concat(b: Builder, step: Step, ins, scope):
    """Splits a value in two along an axis and concatenates the halves swapped."""
    (a,) = ins
    axis = step.option & 1
    parts = tf.split(a.tensor, 2, axis=axis)
    halves = [b.sym(t, moved(lambda v, k=k: np.split(v, 2, axis=axis)[k]), (a,), a.bound)
              for k, t in enumerate(parts)]
    joined = tf.concat([halves[1].tensor, halves[0].tensor], axis=axis)
    return [b.sym(joined, moved(lambda x, y: np.concatenate([x, y], axis=axis)), (halves[1], halves[0]),
                  a.bound)]


def _concat_split(b: Builder, step: Step, ins, scope):
    """Concatenates two values and splits them apart again: two outputs of one Split (or SplitV)."""
    a, c = ins
    axis = step.option & 1
    joined = tf.concat([a.tensor, c.tensor], axis=axis)
    whole = b.sym(joined, moved(lambda x, y: np.concatenate([x, y], axis=axis)), (a, c), max(a.bound, c.bound))
    if step.option & 2:
        parts = tf.split(joined, [N, N], axis=axis)
    else:
        parts = tf.split(joined, 2, axis=axis)
    return [b.sym(t, moved(lambda v, k=k: np.split(v, 2, axis=axis)[k]), (whole,), whole.bound)
            for k, t in enumerate(parts)]


def _pack_unpack(b: Builder, step: Step, ins, scope):
    """Stacks two values and unstacks them: two outputs of one Unpack."""
    a, c = ins
    axis = step.option % 3
    packed = tf.stack([a.tensor, c.tensor], axis=axis)
    whole = b.sym(packed, moved(lambda x, y: np.stack([x, y], axis=axis)), (a, c), max(a.bound, c.bound))
    return [b.sym(t, moved(lambda v, k=k: np.take(v, k, axis=axis)), (whole,), whole.bound)
            for k, t in enumerate(tf.unstack(packed, axis=axis))]


def _select_max(b: Builder, step: Step, ins, scope):
    """``Select(a > b, a, b)``: its error stays bounded when the comparison flips."""
    a, c = ins
    cond = tf.math.greater(a.tensor, c.tensor)
    if step.option & 1:
        tensor = tf.raw_ops.SelectV2(condition=cond, t=a.tensor, e=c.tensor)
    else:
        tensor = tf.raw_ops.Select(condition=cond, x=a.tensor, y=c.tensor)

    def fn(pa, pc):
        return Pair(np.maximum(pa.ref, pc.ref), pa.err + pc.err + np.maximum(pa.err, pc.err))

    return [b.sym(tensor, fn, (a, c), max(a.bound, c.bound))]


def _select_bool(b: Builder, step: Step, ins, scope):
    a, c = ins
    mask_tensor, mask = b.fed(step.seed, (N, N), tf.bool, name="mask")
    tensor = tf.raw_ops.Select(condition=mask_tensor, x=a.tensor, y=c.tensor)
    return [b.sym(tensor, moved(lambda x, y: np.where(mask, x, y)), (a, c), max(a.bound, c.bound))]


def _shape_reshape(b: Builder, step: Step, ins, scope):
    """``Reshape(a, Shape(c))``: a Shape op reads a float value."""
    a, c = ins
    return [b.sym(tf.reshape(a.tensor, tf.raw_ops.Shape(input=c.tensor)), moved(lambda v: v), (a,), a.bound)]


def _size_scale(b: Builder, step: Step, ins, scope):
    """``a * (Cast(Size(c)) / 64)``: an existing int → float Cast, equal to ``a``."""
    a, c = ins
    prec = b.prec
    one = tf.math.multiply(tf.cast(tf.raw_ops.Size(input=c.tensor), tf.float32), np.float32(1.0 / (N * N)))

    def fn(pa):
        return Pair(pa.ref, rounded(pa.ref, pa.err, prec))

    return [b.sym(tf.math.multiply(a.tensor, one), fn, (a,), a.bound)]


def _center_mean(b: Builder, step: Step, ins, scope):
    """``a - Mean(a, axis=1)``: a deny-list reduction feeding an infer op."""
    (a,) = ins
    prec = b.prec
    mean = b.unary(lambda t: tf.math.reduce_mean(t, axis=1, keepdims=True), a,
                   lambda p: Pair(p.ref.mean(axis=1, keepdims=True),
                                  p.err.mean(axis=1, keepdims=True)
                                  + (N + 1) * (prec.u * (np.abs(p.ref) + p.err).mean(axis=1, keepdims=True)
                                               + prec.eta)),
                   a.bound)
    return [_add_like(-1.0, (tf.raw_ops.Sub,))(b, replace(step, option=0), [a, mean], scope)[0]]


def _sum_add(b: Builder, step: Step, ins, scope):
    """``a + Sum(c, axis=0) / 8``: a deny-list Sum broadcast back."""
    a, c = ins
    prec = b.prec
    total = b.unary(lambda t: tf.math.reduce_sum(t, axis=0, keepdims=True), c,
                    lambda p: Pair(p.ref.sum(axis=0, keepdims=True),
                                   p.err.sum(axis=0, keepdims=True)
                                   + (N + 1) * (prec.u * (np.abs(p.ref) + p.err).sum(axis=0, keepdims=True)
                                                + prec.eta)),
                    N * c.bound)
    eighth = b.scaled(total, 1.0 / N)
    return [_add_like(1.0, (tf.raw_ops.AddV2,))(b, replace(step, option=0), [a, eighth], scope)[0]]


def _half_roundtrip(b: Builder, step: Step, ins, scope):
    """``Cast(Cast(a, float16), float32)``: the user's own half round trip."""
    (a,) = ins
    prec = b.prec
    tensor = tf.cast(tf.cast(a.tensor, tf.float16), tf.float32)

    def fn(p):
        return Pair(p.ref, rounded(p.ref, rounded(p.ref, p.err, FLOAT16), prec))

    return [b.sym(tensor, fn, (a,), a.bound)]


def _big_const(b: Builder, step: Step, ins, scope):
    """``a + (Mean(C) - 1e5) / 8`` with C = 1e5 + small integers: exact in float32, overflows in float16."""
    (a,) = ins
    prec = b.prec
    ints = np.random.default_rng(step.seed).integers(0, 8, (N, N))
    big = tf.constant((1e5 + ints).astype(np.float32), name="big")
    offset = (ints.sum(axis=1, keepdims=True) / N).astype(np.float64)
    small = tf.math.multiply(tf.math.subtract(tf.math.reduce_mean(big, axis=1, keepdims=True),
                                              np.float32(1e5)), np.float32(1.0 / N))
    value = offset / N
    term = b.sym(small, lambda: Pair(value, rounded(value, np.zeros_like(value), prec)), (), 1.0, source=True)
    return [_add_like(1.0, (tf.raw_ops.AddV2,))(b, replace(step, option=0), [a, term], scope)[0]]


def _dead_big_const(b: Builder, step: Step, ins, scope):
    """A MatMul of a value with a Const holding 1e5; nothing reads it, so it never runs."""
    big = np.full((N, N), 0.5, np.float32)
    big[step.seed % N, step.option % N] = 1e5
    tf.linalg.matmul(ins[0].tensor, tf.constant(big), name="unread")
    return []


def _add_n(b: Builder, step: Step, ins, scope):
    """AddN of two or three values (an infer op with a number attr)."""
    terms = ins[:2 + step.option % 2]
    prec = b.prec

    def fn(*pairs):
        y = sum(p.ref for p in pairs)
        err = sum(p.err for p in pairs)
        size = sum(np.abs(p.ref) + p.err for p in pairs)
        return Pair(y, err + len(pairs) * (prec.u * size + prec.eta))

    return [b.sym(tf.math.add_n([t.tensor for t in terms]), fn, terms, sum(t.bound for t in terms))]


def avg_pool_2x2(x: np.ndarray) -> np.ndarray:
    """2x2 average pool, stride 1, SAME padding: padded cells are not counted."""
    _, h, w, _ = x.shape
    padded = np.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)))
    ones = np.pad(np.ones_like(x), ((0, 0), (0, 1), (0, 1), (0, 0)))
    total = sum(padded[:, i:i + h, j:j + w, :] for i in (0, 1) for j in (0, 1))
    count = sum(ones[:, i:i + h, j:j + w, :] for i in (0, 1) for j in (0, 1))
    return total / count


def _avg_pool(b: Builder, step: Step, ins, scope):
    x = b.reshaped(ins[0], (1, N, N, 1))
    prec = b.prec

    def fn(p):
        size = avg_pool_2x2(np.abs(p.ref) + p.err)
        return Pair(avg_pool_2x2(p.ref), avg_pool_2x2(p.err) + 5 * (prec.u * size + prec.eta))

    pooled = b.unary(lambda t: tf.nn.avg_pool2d(t, 2, 1, "SAME"), x, fn, x.bound)
    return [b.reshaped(pooled, (N, N))]


def _einsum(b: Builder, step: Step, ins, scope):
    """Einsum as a matrix product, ``ij,jk->ik`` or ``ij,kj->ik``."""
    equation = ("ij,jk->ik", "ij,kj->ik")[step.option & 1]
    a, c = ins
    prec = b.prec

    def fn(pa, pc):
        if equation == "ij,kj->ik":
            pc = Pair(pc.ref.T, pc.err.T)
        return Pair(pa.ref @ pc.ref, product_error(pa, pc, np.matmul, prec, N))

    return [b.sym(tf.einsum(equation, a.tensor, c.tensor), fn, (a, c), N * a.bound * c.bound)]


def depthwise_patches(x: np.ndarray) -> np.ndarray:
    """[H*W, 9, C] windows of a 3x3 SAME, stride-1 depthwise convolution."""
    _, h, w, c = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    taps = [padded[0, i:i + h, j:j + w, :].reshape(h * w, c) for i in range(3) for j in range(3)]
    return np.stack(taps, axis=1)


def _depthwise(b: Builder, step: Step, ins, scope):
    x = b.reshaped(ins[0], (1, 4, 4, 4))
    w = b.weights(step.seed, (3, 3, 4, 1), 1.0 / 3.0)
    prec = b.prec

    def fn(px, pw):
        cols = Pair(depthwise_patches(px.ref), depthwise_patches(px.err))
        taps = Pair(pw.ref.reshape(1, 9, 4), pw.err.reshape(1, 9, 4))
        summed = lambda u, v: (u * v).sum(axis=1)  # noqa: E731
        y = summed(cols.ref, taps.ref).reshape(1, 4, 4, 4)
        return Pair(y, product_error(cols, taps, summed, prec, 9).reshape(1, 4, 4, 4))

    tensor = tf.nn.depthwise_conv2d(x.tensor, w.tensor, [1, 1, 1, 1], "SAME")
    return [b.reshaped(b.sym(tensor, fn, (x, w), 9 * x.bound / 3.0), (N, N))]


def _batch_norm(b: Builder, step: Step, ins, scope):
    """FusedBatchNorm (V1, or V3 by option) in inference mode on the value seen as [1, 4, 4, 4]."""
    x = b.reshaped(ins[0], (1, 4, 4, 4))
    rng = np.random.default_rng(step.seed)
    scale, offset = rng.uniform(0.5, 1.5, 4), rng.uniform(-0.5, 0.5, 4)
    mean, variance = rng.uniform(-0.5, 0.5, 4), rng.uniform(0.5, 2.0, 4)
    consts = [tf.constant(v.astype(np.float32)) for v in (scale, offset, mean, variance)]
    op = tf.raw_ops.FusedBatchNormV3 if step.option & 1 else tf.raw_ops.FusedBatchNorm
    out = op(x=x.tensor, scale=consts[0], offset=consts[1], mean=consts[2], variance=consts[3],
             epsilon=0.001, is_training=False)[0]
    f32 = lambda v: v.astype(np.float32).astype(np.float64)  # noqa: E731
    gain = f32(scale) / np.sqrt(f32(variance) + 0.001)
    prec = b.prec

    def fn(p):
        y = (p.ref - f32(mean)) * gain + f32(offset)
        return Pair(y, rounded(y, np.abs(gain) * p.err + 4 * prec.u * np.abs(gain) * (np.abs(p.ref) + 0.5),
                               prec, 4.0))

    normed = b.sym(out, fn, (x,), float(np.abs(gain).max() * (x.bound + 0.5) + 0.5))
    return [b.reshaped(normed, (N, N))]


def _gather(b: Builder, step: Step, ins, scope):
    """GatherV2 of rows or columns in a seeded order."""
    (a,) = ins
    axis = step.option & 1
    order = np.random.default_rng(step.seed).permutation(N)
    tensor = tf.gather(a.tensor, tf.constant(order, tf.int32), axis=axis)
    return [b.sym(tensor, moved(lambda v: np.take(v, order, axis=axis)), (a,), a.bound)]


def _identity_n(b: Builder, step: Step, ins, scope):
    """IdentityN over a float value and an int32 one: a list(type) attr of mixed types."""
    (a,) = ins
    outs = tf.raw_ops.IdentityN(input=[tf.constant([1, 2], tf.int32), a.tensor])
    return [b.sym(outs[1], moved(lambda v: v), (a,), a.bound)]


def _placeholder(b: Builder, step: Step, ins, scope):
    tensor, value = b.fed(step.seed, (N, N))
    pair = Pair(value.astype(np.float64), np.zeros((N, N)))
    return [b.sym(tensor, lambda: pair, (), 1.0, source=True)]


def _const(b: Builder, step: Step, ins, scope):
    return [b.weights(step.seed, (N, N), 1.0)]


def _variable(use_resource: bool):
    def kind(b: Builder, step: Step, ins, scope):
        init = b.weights(step.seed, (N, N), 1.0)
        var = tf1.Variable(init.tensor, use_resource=use_resource, name="var")
        b.variables.append(var)
        if not use_resource and step.option & 1:
            tensor = var._ref()  # the raw float32_ref: consumers dereference it themselves
        else:
            tensor = var.value()
        return [b.sym(tensor, init.fn, (), init.bound, source=True)]

    return kind


def _bool_cast(b: Builder, step: Step, ins, scope):
    """An existing Cast from bool to float: of a fed bool, or of ``x > threshold`` on a fed x."""
    if step.option & 1:
        mask_tensor, mask = b.fed(step.seed, (N, N), tf.bool, name="mask")
    else:
        x, value = b.fed(step.seed, (N, N))
        threshold = (-0.5, 0.0, 0.25, 0.5)[step.option // 2 % 4]
        mask_tensor, mask = tf.math.greater(x, np.float32(threshold)), value > threshold
    pair = Pair(mask.astype(np.float64), np.zeros((N, N)))
    return [b.sym(tf.cast(mask_tensor, tf.float32), lambda: pair, (), 1.0, source=True)]


def _while(b: Builder, step: Step, ins, scope):
    """A tf.compat.v1 while_loop carrying ``h`` (the body's steps, then tanh) and ``g``.

    ``g`` passes through unchanged (option bit 0) or becomes ``sigmoid(g + h)``.
    The body sees the loop variables and the third picked value, captured from outside.
    """
    h0, g0, captured = ins
    passthrough = bool(step.option & 1)
    bound_h, bound_g = max(h0.bound, 1.0), (g0.bound if passthrough else max(g0.bound, 1.0))
    holders = {}

    pred = _nested_pred(b, step, scope)

    def body(i, h, g):
        h_in = Sym(h, None, (), bound_h)
        g_in = Sym(g, None, (), bound_g)
        holders.update(h=h_in, g=g_in)
        inner = Scope([captured, g_in, h_in], top_level=False, env={}, pred=pred)
        produced = b.run_steps(step.body, inner)
        last = produced[-1] if produced else h_in
        new_h = _elementwise(tf.math.tanh, np.tanh, 1.0, lambda m: 1.0)(b, step, [last], inner)[0]
        if passthrough:
            new_g = g_in
        else:
            total = _add_like(1.0, (tf.raw_ops.AddV2,))(b, replace(step, option=0), [g_in, new_h], inner)[0]
            new_g = _elementwise(tf.math.sigmoid, lambda v: 1 / (1 + np.exp(-v)), 0.25, lambda m: 1.0)(
                b, step, [total], inner)[0]
        holders.update(new_h=new_h, new_g=new_g)
        return i + 1, new_h.tensor, new_g.tensor

    _, h_out, g_out = tf1.while_loop(lambda i, h, g: i < step.count, body,
                                     [tf.constant(0), _no_ref(h0.tensor), _no_ref(g0.tensor)])
    count = step.count

    def run_loop(ph, pg, pc):
        for _ in range(count):
            env = {holders["h"]: ph, holders["g"]: pg, captured: pc}
            ph, pg = evaluate(holders["new_h"], env), evaluate(holders["new_g"], env)
        return ph, pg

    return [b.sym(h_out, lambda ph, pg, pc: run_loop(ph, pg, pc)[0], (h0, g0, captured), bound_h),
            b.sym(g_out, lambda ph, pg, pc: run_loop(ph, pg, pc)[1], (h0, g0, captured), bound_g)]


def _no_ref(tensor):
    """A loop variable must not be a ref: read a raw variable through an Identity."""
    return tf.identity(tensor) if tensor.dtype._is_ref_dtype else tensor


def _fed_pred(b: Builder, step: Step):
    """A predicate: a fed bool, or ``p > 0`` on a fed float (exact in half either way)."""
    if step.option & 1:
        pred, value = b.fed(step.seed, (), tf.bool, name="pred")
        return pred, bool(value)
    p, value = b.fed(step.seed, (), name="p")
    return tf.math.greater(p, np.float32(0.0)), bool(value > 0.0)


def _nested_pred(b: Builder, step: Step, scope: Scope):
    """The predicate for conds nested in this step's blocks: made here at top level, else inherited."""
    if not scope.top_level:
        return scope.pred
    with tf.name_scope("nested"):
        return _fed_pred(b, replace(step, seed=step.seed + 1, option=step.option >> 1))


def _cond(b: Builder, step: Step, ins, scope):
    """A tf.compat.v1 cond on a fed predicate; each branch runs its steps on the picked values."""
    a, c = ins
    pred, taken = _fed_pred(b, step) if scope.top_level else scope.pred
    nested = _nested_pred(b, step, scope)
    outs = {}

    def branch(steps, key):
        def fn():
            inner = Scope([c, a], top_level=False, env={}, pred=nested)
            produced = b.run_steps(steps, inner)
            outs[key] = produced[-1] if produced else inner.values[-1 - (step.option >> 1) % 2]
            return tf.identity(outs[key].tensor)
        return fn

    tensor = tf1.cond(pred, branch(step.body, True), branch(step.orelse, False))
    chosen = outs[taken]
    return [b.sym(tensor, lambda p: p, (chosen,), max(outs[True].bound, outs[False].bound))]


STEP_KINDS: dict[str, Callable] = {
    "matmul": _matmul, "matmul_const": _matmul_const, "conv": _conv, "bmm": _bmm,
    "add": _add_like(1.0, (tf.raw_ops.AddV2, tf.raw_ops.Add)), "sub": _add_like(-1.0, (tf.raw_ops.Sub,)),
    "mul": _mul, "bias_add": _bias_add,
    "tanh": _elementwise(tf.math.tanh, np.tanh, 1.0, lambda m: 1.0),
    "sigmoid": _elementwise(tf.math.sigmoid, lambda v: 1 / (1 + np.exp(-v)), 0.25, lambda m: 1.0),
    "softmax": _softmax, "log_pos": _log_pos, "sqrt_pos": _sqrt_pos,
    "relu": _moved_unary(tf.nn.relu, lambda v: np.maximum(v, 0.0)),
    "identity": _moved_unary(tf.identity, lambda v: v),
    "neg": _neg, "reshape": _reshape,
    "transpose": _moved_unary(tf.transpose, lambda v: v.T),
    "maxpool": _maxpool, "split_concat": _split_concat, "concat_split": _concat_split,
    "pack_unpack": _pack_unpack, "select_max": _select_max, "shape_reshape": _shape_reshape,
    "size_scale": _size_scale, "exp_tanh": _exp_tanh, "center_mean": _center_mean, "sum_add": _sum_add,
    "half_roundtrip": _half_roundtrip, "select_bool": _select_bool, "big_const": _big_const,
    "dead_big_const": _dead_big_const, "placeholder": _placeholder, "const": _const,
    "resource_var": _variable(True), "ref_var": _variable(False), "bool_cast": _bool_cast,
    "while": _while, "cond": _cond, "add_n": _add_n, "avg_pool": _avg_pool, "einsum": _einsum,
    "depthwise": _depthwise, "batch_norm": _batch_norm, "gather": _gather, "identity_n": _identity_n,
}
assert set(STEP_KINDS) == set(ARITY), set(STEP_KINDS) ^ set(ARITY)


# -- running graphs -------------------------------------------------------------


_V1_CONTROL_FLOW = frozenset({"Enter", "RefEnter", "Switch", "RefSwitch", "Merge", "RefMerge"})


def grappler_works_on(graph: tf.Graph) -> bool:
    """Whether to run ``graph`` with Grappler: not when it has v1 control flow.

    On v1 loops and conds TensorFlow 2.21's Grappler misbehaves on graphs of
    ours, the float32 original as much as the rewrite: it never returns
    (arithmetic optimizer on ``Reshape(Reshape(Enter(Identity(VariableV2))))``;
    an inference FusedBatchNorm in a loop body), builds a Mul with inputs from
    two frames, or leaves a cond's Merge without a value when both branches
    read one tensor.
    """
    return not any(op.type in _V1_CONTROL_FLOW for op in graph.get_operations())


def session_config(*, optimize: bool):
    """One thread each (the graphs are tiny), soft placement (some steps are pinned to a GPU)."""
    config = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1,
                             allow_soft_placement=True)
    config.graph_options.rewrite_options.disable_meta_optimizer = not optimize
    return config


def run_graph(graph: tf.Graph, fetches: list[str], feeds: dict[str, np.ndarray], init: str | None,
              *, optimize: bool = True) -> list:
    """Runs ``fetches`` of ``graph`` on ``feeds`` in a fresh Session, after ``init`` if given."""
    with tf1.Session(graph=graph, config=session_config(optimize=optimize)) as sess:
        if init:
            sess.run(graph.get_operation_by_name(init))
        return sess.run([graph.get_tensor_by_name(f) for f in fetches],
                        {graph.get_tensor_by_name(k): v for k, v in feeds.items()})


def run_reference(built: Built) -> tuple[list, bool]:
    """The float32 outputs, and whether Grappler was on to get them.

    Grappler is tried first where it can work at all. When it fails on the
    float32 graph itself, or its result breaks the error bound of the exact
    values, the graph runs unoptimised instead, and the rewritten graph is
    then run the same way. (TensorFlow 2.21's constant folding breaks some
    depthwise convolutions; its arithmetic optimizer computes some graphs of
    transposes, pools and Pack/Unpack pairs wrongly.)
    """
    if grappler_works_on(built.graph):
        try:
            want = run_graph(built.graph, built.fetches, built.feeds, built.init)
            if within_bounds(want, built.expected):
                return want, True
            logger.info("Grappler miscomputes the float32 graph of %r; running it unoptimised", built.recipe)
        except tf.errors.OpError:
            logger.info("Grappler fails on the float32 graph of %r; running it unoptimised", built.recipe)
    return run_graph(built.graph, built.fetches, built.feeds, built.init, optimize=False), False


def within_bounds(values: list, expected: list[Pair]) -> bool:
    """Whether every value lies within its bound of the exact value."""
    return all(np.all(np.abs(v.astype(np.float64) - e.ref) <= e.err) for v, e in zip(values, expected))


def import_graph(graph_def) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    return graph


# -- the properties -------------------------------------------------------------


@dataclass
class Verdict:
    """What checking one graph found: failed properties (name → detail) and numeric slack."""

    failures: dict[str, str] = field(default_factory=dict)
    converted: int = 0
    casts: int = 0
    worst_ratio: float = 0.0  # max |got - want| / tolerance over the fetched elements
    optimized: bool = False  # whether both graphs ran with Grappler
    elements: int = 0  # fetched float elements compared
    loose: int = 0  # of which the tolerance exceeds a tenth of that fetch's largest magnitude

    @property
    def ok(self) -> bool:
        return not self.failures

    def explain(self) -> str:
        return "\n".join(f"{name}: {detail}" for name, detail in self.failures.items())


def check_rewrite(built: Built) -> Verdict:
    """Rewrites ``built`` and checks every property; returns what failed instead of raising.

    Properties: the rewrite succeeds without touching its input; it is
    deterministic (byte-identical output twice) and independent of node
    order; rewriting its output changes nothing; the postconditions of
    :func:`amp_rewrite.paint.checks.violations` hold; the report
    names every node, and each node's reason states the dtype it has; the
    output imports and runs, fetched tensors keep their dtype, and they agree
    with float32 within the half tolerance model.
    """
    verdict = Verdict()
    before = built.graph_def.SerializeToString(deterministic=True)
    try:
        result = rewrite(built.graph_def, fetches=built.rewrite_fetches, config=built.config)
    except Exception as exc:  # noqa: BLE001 - any exception is the finding
        verdict.failures["rewrite"] = f"{type(exc).__name__}: {exc}"
        return verdict
    verdict.converted, verdict.casts = len(result.converted), len(result.casts)
    checks = (_input_untouched(built, before), _deterministic(built, result), _order_independent(built, result),
              _idempotent(built, result),
              _report_complete(built, result), _allow_ops_convert(built, result), _left_alone_unchanged(built, result),
              _deny_ops_stay(built, result), _reasons_agree(result),
              _html_report_renders(result))
    for name, detail in checks:
        if detail:
            verdict.failures[name] = detail
    for name, detail in violations(built.graph_def, result.graph_def, casts=result.casts,
                                   fetches=built.rewrite_fetches, left_alone=_left_alone(built)):
        verdict.failures[name] = detail
    _check_numerics(built, result, verdict)
    return verdict


def _reasons_agree(result):
    from amp_rewrite.paint.explain import disagreements

    found = disagreements(result)
    return "reasons agree with dtypes", (f"{len(found)} reasons state another dtype: {found[:3]}" if found else None)


def _input_untouched(built: Built, before: bytes):
    same = built.graph_def.SerializeToString(deterministic=True) == before
    return "input untouched", None if same else "rewrite() mutated the caller's GraphDef"


def _deterministic(built: Built, result):
    again = rewrite(built.graph_def, fetches=built.rewrite_fetches, config=built.config)
    same = (again.graph_def.SerializeToString(deterministic=True)
            == result.graph_def.SerializeToString(deterministic=True))
    return "deterministic", None if same else "rewriting the same input twice gave different bytes"


def _order_independent(built: Built, result):
    reordered = type(built.graph_def)()
    reordered.CopyFrom(built.graph_def)
    nodes = list(reordered.node)[::-1]
    del reordered.node[:]
    reordered.node.extend(nodes)
    other = rewrite(reordered, fetches=built.rewrite_fetches, config=built.config)
    if set(other.converted) != set(result.converted):
        diff = sorted(set(other.converted) ^ set(result.converted))
        return "node order", f"reversing the node order changes the converted nodes: {diff}"
    if set(other.casts) != set(result.casts):
        diff = sorted(set(other.casts) ^ set(result.casts))
        return "node order", f"reversing the node order changes the casts: {diff}"
    return "node order", None


def _idempotent(built: Built, result):
    twice = rewrite(result.graph_def, fetches=built.rewrite_fetches, config=built.config)
    if twice.graph_def != result.graph_def or twice.converted or twice.casts:
        return "idempotent", (f"rewriting the output again converted {twice.converted} "
                              f"and added casts {twice.casts}")
    return "idempotent", None


# Ops with CPU half kernels for both targets, always on the allow list; and ops on each deny list.
_ALLOW_OPS = frozenset({"MatMul", "Conv2D", "BatchMatMulV2", "Einsum", "DepthwiseConv2dNative"})
_DENY_OPS = {"float16": frozenset({"Exp", "Sum", "Mean"}), "bfloat16": frozenset({"Exp"})}


def _readers_of_consts_beyond_half(graph_def, target: str) -> set[str]:
    """Nodes reading a float32 Const with a finite value beyond the target's range: they stay float32.

    For float16 beyond 65504; for bfloat16 a value its Cast makes infinite (``tf.float32.min``).
    """
    def is_beyond(values):
        finite = np.nan_to_num(values, posinf=0, neginf=0)
        if target == "float16":
            return np.any(np.abs(finite) > 65504)
        return bool(np.any(np.isinf(tf.cast(finite, tf.bfloat16).numpy().astype(np.float32))))

    big = {n.name for n in graph_def.node if n.op == "Const" and n.attr["dtype"].type == tf.float32.as_datatype_enum
           and is_beyond(tf.make_ndarray(n.attr["value"].tensor))}
    return {n.name for n in graph_def.node if any(ref.split(":")[0] in big for ref in n.input)}


def _left_alone(built: Built) -> set[str]:
    """Nodes the rewrite must not change: fetched, preserved, or pinned to a GPU."""
    kept = {name.split(":")[0] for name in built.rewrite_fetches} | set(built.config.preserve)
    return kept | {n.name for n in built.graph_def.node if "GPU" in n.device}


def _allow_ops_convert(built: Built, result):
    converted, kept = set(result.converted), _left_alone(built)
    kept |= _readers_of_consts_beyond_half(built.graph_def, built.config.target)
    missed = sorted(n.name for n in built.graph_def.node
                    if n.op in _ALLOW_OPS and n.name not in kept and n.name not in converted)
    return "allow ops convert", (f"allow-list ops left float32: {missed[:5]}" if missed else None)


def _left_alone_unchanged(built: Built, result):
    changed = sorted(_left_alone(built) & set(result.converted))
    return "left alone", (f"fetched, preserved or GPU nodes changed: {changed}" if changed else None)


def _deny_ops_stay(built: Built, result):
    deny = _DENY_OPS[built.config.target]
    changed = sorted(n.name for n in built.graph_def.node if n.op in deny and n.name in set(result.converted))
    return "deny ops stay float32", (f"deny-list ops converted: {changed[:5]}" if changed else None)


def _report_complete(built: Built, result):
    nodes = result.report()["nodes"]
    names = {n.name for n in built.graph_def.node}
    out_names = {n.name for n in result.graph_def.node}
    missing = sorted(names - set(nodes))
    if missing:
        return "report", f"report lacks nodes {missing[:5]}"
    bad_cause = sorted(k for k, v in nodes.items() if v.get("cause") and v["cause"] not in out_names)
    if bad_cause:
        return "report", f"causes name no node: {bad_cause[:5]}"
    if not set(result.casts) <= out_names - names:
        return "report", "casts are not new nodes of the output"
    return "report", None


def _html_report_renders(result):
    import json

    from amp_rewrite.report.html import render_html

    page = render_html(result, title="fuzz")
    start = page.index('id="graph-data">') + len('id="graph-data">')
    names = json.loads(page[start:page.index("</script>", start)])["name"]
    same = names == [node.name for node in result.graph_def.node]
    return "html report", None if same else "the page's data does not list the rewritten graph's nodes"


def _check_numerics(built: Built, result, verdict: Verdict) -> None:
    try:
        want, optimize = run_reference(built)
        verdict.optimized = optimize
    except Exception as exc:  # noqa: BLE001
        verdict.failures["harness: float32 graph runs"] = f"{type(exc).__name__}: {exc}"
        return
    try:
        got = run_graph(import_graph(result.graph_def), built.fetches, built.feeds, built.init, optimize=optimize)
    except Exception as exc:  # noqa: BLE001
        verdict.failures["runs"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        return
    target = PRECISIONS[built.config.target]
    for name, w, g, expected in zip(built.fetches, want, got, built.expected):
        if g.dtype != w.dtype:
            verdict.failures["dtype"] = f"{name}: {g.dtype} != {w.dtype}"
            continue
        single_share = SINGLE.u / target.u
        tolerance = expected.err * (1.0 + single_share) + 1e-30
        harness = np.abs(w.astype(np.float64) - expected.ref)
        if not np.all(harness <= expected.err):
            worst = np.unravel_index(np.argmax(harness - expected.err), harness.shape)
            verdict.failures["harness: float32 matches exact"] = (
                f"{name}[{worst}]: float32 {w[worst]!r}, exact {expected.ref[worst]!r}, "
                f"bound {expected.err[worst]!r}")
        # Where the bound keeps the value inside the half range, the rewrite must not overflow;
        # elsewhere (errors compounded past the range) an inf proves nothing.
        guarded = np.abs(expected.ref) + expected.err < target.max
        lost = guarded & np.isfinite(w) & ~np.isfinite(g)
        if np.any(lost):
            worst = np.unravel_index(np.argmax(lost), g.shape)
            verdict.failures["finite"] = f"{name}[{worst}]: rewritten {g[worst]!r}, float32 {w[worst]!r}"
            continue
        gap = np.where(guarded, np.abs(g.astype(np.float64) - w.astype(np.float64)), 0.0)
        if not np.all(gap <= tolerance):
            worst = np.unravel_index(np.argmax(np.where(gap <= tolerance, -np.inf, 1.0)), gap.shape)
            verdict.failures["close to float32"] = (
                f"{name}[{worst}]: rewritten {g[worst]!r}, float32 {w[worst]!r}, "
                f"tolerance {tolerance[worst]!r}")
        if w.dtype.kind == "f":
            verdict.elements += w.size
            verdict.loose += int(np.sum(tolerance > 0.1 * np.abs(w).max(initial=0.0)))
        finite = tolerance > 0
        if np.any(finite):
            ratio = float(np.max(np.where(finite, gap / np.where(finite, tolerance, 1.0), 0.0)))
            verdict.worst_ratio = max(verdict.worst_ratio, ratio)
