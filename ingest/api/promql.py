"""PromQL over the stored readings: the supported subset, evaluated as Prometheus does.

Queries are parsed by ``promql-parser`` (the Python binding of GreptimeTeam's Rust parser,
which follows Prometheus' grammar). Supported:

- instant and range vector selectors with ``=``, ``!=``, ``=~``, ``!~``, ``offset`` and ``@``;
- ``avg/min/max/sum/count/last_over_time``, ``rate``, ``increase``, ``delta``;
- ``sum``, ``avg``, ``min``, ``max``, ``count`` with ``by``/``without``;
- unary minus, and arithmetic (``+ - * / % ^``) and comparisons (with or without ``bool``)
  between scalars, or between a vector and a scalar.

Anything else is a :class:`PromError` naming it. Times follow Prometheus 3: an instant
selector takes a series' latest sample in ``(t - lookback, t]`` (so a sensor that stops
reporting leaves an instant query after the lookback), a range selector the samples in
``(t - range, t]``.

The evaluation is column-wise: a vector is a value (or None) per series per step, so a
range query reads each selector's samples once. Reading is :mod:`ingest.api.prom_store`'s;
the bucket statistics path is :mod:`ingest.api.prom_stats`'s.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import promql_parser as pp

from ingest.api.prom_store import NAME, Labels, Matcher, MatcherError, Series

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    type Fetch = Callable[[list[Matcher], int, int], Awaitable[list[Series]]]
    type StatsFetch = Callable[
        [list[Matcher], str, int, list[int]], Awaitable[dict[Labels, list[float | None]] | None]
    ]

MAX_POINTS_PER_SERIES = 11_000  # Prometheus' own bound on a range query's resolution
OVER_TIME = {"avg_over_time", "min_over_time", "max_over_time", "sum_over_time"}
OVER_TIME |= {"count_over_time", "last_over_time"}
RATES = {"rate", "increase", "delta"}
SUPPORTED_FUNCTIONS = sorted(OVER_TIME | RATES)
AGGREGATIONS = {"sum", "avg", "min", "max", "count"}
KEEP_NAME = {"last_over_time"}  # Prometheus keeps the metric name of these


class PromError(Exception):
    """An error answered in Prometheus' shape: ``errorType`` and HTTP status."""

    def __init__(self, error_type: str, message: str, status: int) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status


def bad_data(message: str) -> PromError:
    """A bad parameter or query (400)."""
    return PromError("bad_data", message, 400)


def unsupported(what: str) -> PromError:
    """A valid query this API does not evaluate (422, ``execution``)."""
    return PromError(
        "execution",
        f"{what} is not supported by ingest api (supported: vector and range selectors, "
        f"{', '.join(SUPPORTED_FUNCTIONS)}, {', '.join(sorted(AGGREGATIONS))} by/without, "
        "and arithmetic and comparisons with scalars)",
        422,
    )


def parse(query: str) -> Any:  # noqa: ANN401 - the parser's expression node
    """The expression of a query, or bad_data with the parser's message."""
    try:
        return pp.parse(query)
    except ValueError as exc:
        raise bad_data(f'invalid parameter "query": {exc}') from None


# -- values ------------------------------------------------------------------------------


@dataclass(slots=True)
class Scalar:
    """A scalar at each step."""

    values: list[float]


@dataclass(slots=True)
class Vector:
    """An instant vector: a value (or None: no sample) per series per step."""

    series: dict[Labels, list[float | None]]


@dataclass(slots=True)
class Matrix:
    """A range vector at one instant (only an instant query answers one)."""

    series: list[Series]


type Value = Scalar | Vector | Matrix


@dataclass(frozen=True, slots=True)
class Steps:
    """The evaluation instants (milliseconds) and the lookback of instant selectors."""

    times: list[int]
    lookback_ms: int
    step_ms: int = 0  # 0: an instant query
    end_ms: int | None = None  # a range query's end (``@ end()``): the last step if None


def matchers_of(selector: Any) -> list[Matcher]:  # noqa: ANN401 - a VectorSelector
    """A selector's matchers (its metric name as ``__name__="..."``)."""
    if selector.matchers.or_matchers:
        raise unsupported("a selector with 'or'")
    out = []
    if selector.name:
        out.append(Matcher.make(NAME, "=", selector.name))
    ops = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~"}
    ops["MatchOp.NotRe"] = "!~"
    for m in selector.matchers.matchers:
        try:
            out.append(Matcher.make(m.name, ops[str(m.op)], m.value))
        except MatcherError as exc:
            raise bad_data(str(exc)) from None
    return out


def drop_name(labels: Labels) -> Labels:
    """Labels without ``__name__``."""
    return tuple(p for p in labels if p[0] != NAME)


def put_unique(
    out: dict[Labels, list[float | None]], labels: Labels, column: list[float | None]
) -> None:
    """Add a series to a vector; two of the same labels are Prometheus' error."""
    if labels in out:
        raise PromError("execution", "vector cannot contain metrics with the same labelset", 422)
    out[labels] = column


class Evaluator:
    """Evaluates one expression over the steps, reading through ``fetch``."""

    def __init__(self, steps: Steps, fetch: Fetch, stats: StatsFetch | None = None) -> None:
        self.steps = steps
        self.fetch = fetch
        self.stats = stats

    def instants(self, selector: Any) -> list[int]:  # noqa: ANN401 - a VectorSelector
        """The instants a selector is read at (each step, or its ``@``), less its offset."""
        offset = int(selector.offset.total_seconds() * 1000) if selector.offset else 0
        at = selector.at
        times = self.steps.times
        if at is not None:
            kind = str(at.type)
            if kind.endswith("Start"):
                fixed = times[0]
            elif kind.endswith("End"):
                fixed = times[-1] if self.steps.end_ms is None else self.steps.end_ms
            else:
                fixed = round(at.at.timestamp() * 1000)
            times = [fixed] * len(times)
        return [t - offset for t in times]

    async def eval(self, node: Any) -> Value:  # noqa: ANN401 - a parser node
        """The value of an expression node."""
        if isinstance(node, pp.NumberLiteral):
            return Scalar([float(node.val)] * len(self.steps.times))
        if isinstance(node, pp.ParenExpr):
            return await self.eval(node.expr)
        if isinstance(node, pp.UnaryExpr):
            return self.negate(await self.eval(node.expr))
        if isinstance(node, pp.MatrixSelector) and self.steps.step_ms:
            raise bad_data(
                'invalid expression type "range vector" for range query, '
                "must be Scalar or instant Vector"
            )
        handlers: dict[type, Callable[[Any], Awaitable[Value]]] = {
            pp.VectorSelector: self.vector,
            pp.MatrixSelector: self.matrix,
            pp.Call: self.call,
            pp.AggregateExpr: self.aggregate,
            pp.BinaryExpr: self.binary,
        }
        handler = handlers.get(type(node))
        if handler is not None:
            return await handler(node)
        what = {pp.StringLiteral: "a string expression", pp.SubqueryExpr: "a subquery"}
        raise unsupported(what.get(type(node), f"the expression {type(node).__name__}"))

    async def vector(self, selector: Any) -> Vector:  # noqa: ANN401 - a VectorSelector
        """An instant selector: each series' latest sample within the lookback."""
        at = self.instants(selector)
        lookback = self.steps.lookback_ms
        series = await self.fetch(matchers_of(selector), min(at) - lookback, max(at))
        out: dict[Labels, list[float | None]] = {}
        for s in series:
            column: list[float | None] = []
            for t in at:
                i = bisect_right(s.times, t) - 1
                column.append(s.values[i] if i >= 0 and s.times[i] > t - lookback else None)
            if any(v is not None for v in column):
                out[s.labels] = column
        return Vector(out)

    async def matrix(self, node: Any) -> Matrix:  # noqa: ANN401 - a MatrixSelector
        """A range selector at an instant query's time."""
        selector = node.vector_selector
        (t,) = self.instants(selector)
        span = int(node.range.total_seconds() * 1000)
        series = await self.fetch(matchers_of(selector), t - span, t)
        return Matrix([s for s in series if s.times])

    async def call(self, node: Any) -> Vector:  # noqa: ANN401 - a Call
        """A function of a range vector."""
        name = node.func.name
        if name not in OVER_TIME | RATES:
            raise unsupported(f"the function {name}()")
        arg = node.args[0]
        if not isinstance(arg, pp.MatrixSelector):
            raise unsupported(f"{name}() of anything but a range selector (a subquery)")
        selector = arg.vector_selector
        at = self.instants(selector)
        span = int(arg.range.total_seconds() * 1000)
        matchers = matchers_of(selector)
        if self.stats is not None and name in OVER_TIME - {"last_over_time"}:
            from_stats = await self.stats(matchers, name, span, at)
            if from_stats is not None:
                return Vector(from_stats)
        series = await self.fetch(matchers, min(at) - span, max(at))
        out: dict[Labels, list[float | None]] = {}
        for s in series:
            column = [window(name, s, t - span, t, span) for t in at]
            if any(v is not None for v in column):
                put_unique(out, s.labels if name in KEEP_NAME else drop_name(s.labels), column)
        return Vector(out)

    async def aggregate(self, node: Any) -> Vector:  # noqa: ANN401 - an AggregateExpr
        """``sum/avg/min/max/count`` by or without labels."""
        op = str(node.op)
        if op not in AGGREGATIONS:
            raise unsupported(f"the aggregation {op}")
        inner = await self.eval(node.expr)
        if not isinstance(inner, Vector):
            raise bad_data(
                f"expected type instant vector in aggregation expression, got {_kind(inner)}"
            )
        modifier = node.modifier
        names = set(modifier.labels) if modifier is not None else set()
        without = modifier is not None and str(modifier.type).endswith("Without")
        groups: dict[Labels, list[list[float | None]]] = {}
        for labels, column in inner.series.items():
            if without:
                key = tuple(p for p in labels if p[0] not in names and p[0] != NAME)
            else:
                key = tuple(p for p in labels if p[0] in names)
            groups.setdefault(key, []).append(column)
        out: dict[Labels, list[float | None]] = {}
        for key, columns in groups.items():
            column = [_combine(op, [c[i] for c in columns]) for i in range(len(self.steps.times))]
            if any(v is not None for v in column):
                out[key] = column
        return Vector(out)

    @staticmethod
    def negate(value: Value) -> Value:
        """Unary minus (drops the metric name)."""
        if isinstance(value, Scalar):
            return Scalar([-v for v in value.values])
        if isinstance(value, Vector):
            out: dict[Labels, list[float | None]] = {}
            for labels, column in value.series.items():
                put_unique(out, drop_name(labels), [None if v is None else -v for v in column])
            return Vector(out)
        raise unsupported("unary minus of a range vector")

    async def binary(self, node: Any) -> Value:  # noqa: ANN401 - a BinaryExpr
        """Arithmetic and comparison between scalars, or a vector and a scalar."""
        op = str(node.op)
        if op not in ARITHMETIC and op not in COMPARISON:
            raise unsupported(f"the operator {op}")
        modifier = node.modifier
        as_bool = modifier is not None and bool(modifier.return_bool)
        if modifier is not None and (
            modifier.matching is not None
            or str(modifier.card) not in {"VectorMatchCardinality.OneToOne", "OneToOne"}
        ):
            raise unsupported("vector matching (on, ignoring, group_left, group_right)")
        lhs, rhs = await self.eval(node.lhs), await self.eval(node.rhs)
        if isinstance(lhs, Matrix) or isinstance(rhs, Matrix):
            raise bad_data("binary expression must contain only scalar and instant vector types")
        if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
            if op in COMPARISON:
                return Scalar(
                    [
                        float(COMPARISON[op](a, b))
                        for a, b in zip(lhs.values, rhs.values, strict=True)
                    ]
                )
            return Scalar([arith(op, a, b) for a, b in zip(lhs.values, rhs.values, strict=True)])
        if isinstance(lhs, Vector) and isinstance(rhs, Vector):
            raise unsupported("a binary operation between two vectors")
        if isinstance(lhs, Vector):
            assert isinstance(rhs, Scalar)
            return with_scalar(op, as_bool, lhs, rhs, flip=False)
        assert isinstance(lhs, Scalar)
        assert isinstance(rhs, Vector)
        return with_scalar(op, as_bool, rhs, lhs, flip=True)


def with_scalar(op: str, as_bool: bool, vector: Vector, scalar: Scalar, *, flip: bool) -> Vector:
    """``vector op scalar`` (``scalar op vector`` when ``flip``), value by value.

    Arithmetic and ``bool`` comparisons drop the metric name; a comparison without
    ``bool`` keeps the vector's samples for which it holds, names and all.
    """
    out: dict[Labels, list[float | None]] = {}
    keep = op in COMPARISON and not as_bool
    for labels, column in vector.series.items():
        new: list[float | None] = []
        for v, s in zip(column, scalar.values, strict=True):
            if v is None:
                new.append(None)
                continue
            a, b = (s, v) if flip else (v, s)
            if op in ARITHMETIC:
                new.append(arith(op, a, b))
            elif as_bool:
                new.append(float(COMPARISON[op](a, b)))
            else:
                new.append(v if COMPARISON[op](a, b) else None)
        if any(v is not None for v in new):
            put_unique(out, labels if keep else drop_name(labels), new)
    return Vector(out)


def _kind(value: Value) -> str:
    return {Scalar: "scalar", Vector: "instant vector", Matrix: "range vector"}[type(value)]


def _combine(op: str, values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return OVER[AGGREGATE_AS[op]](present)


AGGREGATE_AS = {
    "sum": "sum_over_time",
    "avg": "avg_over_time",
    "count": "count_over_time",
    "min": "min_over_time",
    "max": "max_over_time",
}


COMPARISON: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}
ARITHMETIC = {"+", "-", "*", "/", "%", "^", "atan2"}


def arith(op: str, a: float, b: float) -> float:  # noqa: PLR0911 - one case per operator
    """``a op b`` with IEEE 754 results where Python would raise (as Go computes them)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            return (
                math.nan
                if a == 0 or math.isnan(a)
                else math.copysign(math.inf, a) * math.copysign(1, b)
            )
        return a / b
    if op == "%":
        return math.nan if b == 0 or math.isinf(a) else math.fmod(a, b)
    if op == "atan2":
        return math.atan2(a, b)
    try:
        return math.pow(a, b)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


def window(name: str, s: Series, start: int, end: int, span_ms: int) -> float | None:
    """A ``*_over_time`` or rate function over a series' samples in ``(start, end]``."""
    lo, hi = bisect_right(s.times, start), bisect_right(s.times, end)
    if lo >= hi:
        return None
    values = s.values[lo:hi]
    if name in RATES:
        return extrapolated_rate(s.times[lo:hi], values, start, end, span_ms, name)
    return OVER[name](values)


def _sum(values: list[float]) -> float:
    """An exact sum of finite values (``fsum``); infinities and NaN as IEEE 754 adds them."""
    return math.fsum(values) if all(map(math.isfinite, values)) else sum(values)


def _extreme(pick: Callable[[list[float]], float]) -> Callable[[list[float]], float]:
    """Min or max ignoring NaN (NaN only when every value is NaN), as Prometheus."""

    def extreme(values: list[float]) -> float:
        numbers = [v for v in values if not math.isnan(v)]
        return pick(numbers) if numbers else math.nan

    return extreme


OVER: dict[str, Callable[[list[float]], float]] = {
    "avg_over_time": lambda vs: _sum(vs) / len(vs),
    "sum_over_time": _sum,
    "count_over_time": lambda vs: float(len(vs)),
    "last_over_time": lambda vs: vs[-1],
    "min_over_time": _extreme(min),
    "max_over_time": _extreme(max),
}


def extrapolated_rate(
    times: Sequence[int], values: Sequence[float], start: int, end: int, span_ms: int, name: str
) -> float | None:
    """``rate``, ``increase`` or ``delta`` with Prometheus' extrapolation to the range's ends."""
    if len(values) < 2:
        return None
    counter = name != "delta"
    result = values[-1] - values[0]
    if counter:
        last = 0.0
        for v in values:
            if v < last:
                result += last
            last = v
    to_start = (times[0] - start) / 1000
    to_end = (end - times[-1]) / 1000
    sampled = (times[-1] - times[0]) / 1000
    average = sampled / (len(values) - 1)
    threshold = average * 1.1
    extrapolate = sampled
    if to_start >= threshold:
        to_start = average / 2
    if counter and result > 0 and values[0] >= 0:
        to_zero = sampled * (values[0] / result)
        to_start = min(to_start, to_zero)
    extrapolate += to_start
    if to_end >= threshold:
        to_end = average / 2
    extrapolate += to_end
    factor = extrapolate / sampled
    if name == "rate":
        factor /= span_ms / 1000
    return result * factor
