"""A small, slow, obvious PromQL evaluator over readings as they were written.

It shares nothing with ingest's evaluator but the parser: each step, each series is found
by scanning the readings, the window's samples by filtering them, and the answer is built
in Prometheus' JSON shape. Tests compare the API's answers with it.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import TYPE_CHECKING, Any

import promql_parser as pp

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from ingest.model import Reading

LOOKBACK = 300_000
type Key = tuple[tuple[str, str], ...]


def ms(ts: datetime) -> int:
    return round(ts.timestamp() * 1000)


def sample(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


class Reference:
    """Evaluates queries over a list of readings."""

    def __init__(self, readings: list[Reading]) -> None:
        self.samples: dict[Key, list[tuple[int, float]]] = {}
        for r in readings:
            for name, value in r.values.items():
                v = sample(value)
                if v is None:
                    continue
                labels = {k: t for k, t in (r.tags or {}).items() if t != ""}
                labels |= {"sensor_id": r.sensor_id, "__name__": name}
                self.samples.setdefault(tuple(sorted(labels.items())), []).append((ms(r.ts), v))
        for points in self.samples.values():
            points.sort()
        self.lookback = LOOKBACK

    def last_time(self) -> datetime:
        from datetime import UTC, datetime  # noqa: PLC0415

        last = max(t for points in self.samples.values() for t, _ in points)
        return datetime.fromtimestamp(last / 1000, UTC)

    def select(self, selector: Any) -> dict[Key, list[tuple[int, float]]]:
        out = {}
        for key, points in self.samples.items():
            labels = dict(key)
            ok = selector.name is None or labels["__name__"] == selector.name
            for m in selector.matchers.matchers:
                value = labels.get(m.name, "")
                op = str(m.op).split(".")[-1]
                if op == "Equal":
                    ok &= value == m.value
                elif op == "NotEqual":
                    ok &= value != m.value
                else:
                    found = re.fullmatch(f"(?s:{m.value})", value) is not None
                    ok &= found if op == "Re" else not found
            if ok:
                out[key] = points
        return out

    def at(self, node: Any, t: int) -> Any:  # noqa: C901, PLR0911, PLR0912
        """A scalar (float), a vector ({key: value}) or a matrix ({key: points}) at ``t``."""
        if isinstance(node, pp.NumberLiteral):
            return float(node.val)
        if isinstance(node, pp.ParenExpr):
            return self.at(node.expr, t)
        if isinstance(node, pp.VectorSelector):
            t -= int(node.offset.total_seconds() * 1000) if node.offset else 0
            out = {}
            for key, points in self.select(node).items():
                inside = [v for ts, v in points if t - self.lookback < ts <= t]
                if inside:
                    out[key] = inside[-1]
            return out
        if isinstance(node, pp.MatrixSelector):
            sel = node.vector_selector
            t -= int(sel.offset.total_seconds() * 1000) if sel.offset else 0
            span = int(node.range.total_seconds() * 1000)
            found = {
                k: [(ts, v) for ts, v in p if t - span < ts <= t]
                for k, p in self.select(sel).items()
            }
            return ("matrix", {k: p for k, p in found.items() if p}, t - span, t, span)
        if isinstance(node, pp.UnaryExpr):
            inner = self.at(node.expr, t)
            if isinstance(inner, float):
                return -inner
            return {drop(k): -v for k, v in inner.items()}
        if isinstance(node, pp.Call):
            _, found, start, end, span = self.at(node.args[0], t)
            name = node.func.name
            out = {}
            for key, points in found.items():
                value = over(name, points, start, end, span)
                if value is not None:
                    out[key if name == "last_over_time" else drop(key)] = value
            return out
        if isinstance(node, pp.AggregateExpr):
            inner = self.at(node.expr, t)
            mod = node.modifier
            groups: dict[Key, list[float]] = {}
            for key, value in inner.items():
                if mod is None:
                    g: Key = ()
                elif str(mod.type).endswith("By"):
                    g = tuple(p for p in key if p[0] in mod.labels)
                else:
                    g = tuple(p for p in key if p[0] not in mod.labels and p[0] != "__name__")
                groups.setdefault(g, []).append(value)
            op = str(node.op)
            fn: dict[str, Callable[[list[float]], float]] = {
                "sum": sum,
                "min": min,
                "max": max,
                "count": lambda vs: float(len(vs)),
                "avg": lambda vs: sum(vs) / len(vs),
            }
            return {g: float(fn[op](vs)) for g, vs in groups.items()}
        if isinstance(node, pp.BinaryExpr):
            return self.binary(node, t)
        raise NotImplementedError(type(node).__name__)

    def binary(self, node: Any, t: int) -> Any:
        op = str(node.op)
        a, b = self.at(node.lhs, t), self.at(node.rhs, t)
        as_bool = node.modifier is not None and node.modifier.return_bool
        compare = op in {"==", "!=", ">", "<", ">=", "<="}

        def apply(x: float, y: float) -> float:
            if compare:
                return float(eval(f"x {op} y"))
            if op == "^":
                return math.pow(x, y)
            if op == "%":
                return math.fmod(x, y)
            return float(eval(f"x {op} y"))

        if isinstance(a, float) and isinstance(b, float):
            return apply(a, b)
        vec, flip = (a, False) if isinstance(a, dict) else (b, True)
        scalar = b if not flip else a
        out = {}
        for key, v in vec.items():
            x, y = (scalar, v) if flip else (v, scalar)
            r = apply(x, y)
            if compare and not as_bool:
                if r:
                    out[key] = v
            else:
                out[drop(key)] = r
        return out

    def instant(self, query: str, t: datetime) -> dict[str, Any]:
        value = self.at(pp.parse(query), ms(t))
        s = ms(t) / 1000
        if isinstance(value, float):
            return {"resultType": "scalar", "result": [s, fmt(value)]}
        if isinstance(value, tuple):
            return {
                "resultType": "matrix",
                "result": [
                    {"metric": dict(k), "values": [[ts / 1000, fmt(v)] for ts, v in p]}
                    for k, p in sorted(value[1].items())
                ],
            }
        return {
            "resultType": "vector",
            "result": [{"metric": dict(k), "value": [s, fmt(v)]} for k, v in sorted(value.items())],
        }

    def range(
        self, query: str, start: datetime, end: datetime, step_s: int
    ) -> list[dict[str, Any]]:
        node = pp.parse(query)
        out: dict[Key, list[list[Any]]] = {}
        for t in range(ms(start), ms(end) + 1, step_s * 1000):
            value = self.at(node, t)
            if isinstance(value, float):
                value = {(): value}
            for key, v in value.items():
                out.setdefault(key, []).append([t / 1000, fmt(v)])
        return [{"metric": dict(k), "values": p} for k, p in sorted(out.items())]


def drop(key: Key) -> Key:
    return tuple(p for p in key if p[0] != "__name__")


def over(
    name: str, points: list[tuple[int, float]], start: int, end: int, span: int
) -> float | None:
    values = [v for _, v in points]
    plain: dict[str, Callable[[], float]] = {
        "avg_over_time": lambda: sum(values) / len(values),
        "min_over_time": lambda: min(values),
        "max_over_time": lambda: max(values),
        "sum_over_time": lambda: sum(values),
        "count_over_time": lambda: float(len(values)),
        "last_over_time": lambda: values[-1],
    }
    if name in plain:
        return plain[name]()
    if len(points) < 2:
        return None
    # Prometheus' extrapolatedRate, step by step
    delta = values[-1] - values[0]
    if name != "delta":
        for prev, cur in itertools.pairwise(values):
            if cur < prev:
                delta += prev
    first, last = points[0][0], points[-1][0]
    sampled = (last - first) / 1000
    avg = sampled / (len(points) - 1)
    to_start, to_end = (first - start) / 1000, (end - last) / 1000
    if to_start >= avg * 1.1:
        to_start = avg / 2
    if name != "delta" and delta > 0 and values[0] >= 0:
        to_start = min(to_start, sampled * values[0] / delta)
    if to_end >= avg * 1.1:
        to_end = avg / 2
    result = delta * (sampled + to_start + to_end) / sampled
    return result / (span / 1000) if name == "rate" else result


def fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def close(got: Any, expected: Any) -> bool:
    """Equal JSON answers, sample values within floating-point tolerance."""
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(close(got[k], expected[k]) for k in got)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(
            close(a, b) for a, b in zip(got, expected, strict=True)
        )
    if isinstance(got, str) and isinstance(expected, str) and got != expected:
        try:
            a, b = float(got), float(expected)
        except ValueError:
            return False
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    if isinstance(got, float | int) and isinstance(expected, float | int):
        return math.isclose(got, expected, rel_tol=1e-12)
    return bool(got == expected)
