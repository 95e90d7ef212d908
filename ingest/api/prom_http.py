"""The Prometheus HTTP query API of ``ingest api``: ``/api/v1/...``, GET and POST.

    /api/v1/query                 an instant query (query, time, lookback_delta)
    /api/v1/query_range           a range query (query, start, end, step, lookback_delta)
    /api/v1/series                the label sets of series (match[], start, end)
    /api/v1/labels                label names (match[], start, end)
    /api/v1/label/<name>/values   a label's values (match[], start, end)
    /api/v1/metadata              each measurement as a gauge, with its unit (metric, limit)

Answers and errors have Prometheus' shape (``{"status": "success", "data": ...}``,
``{"status": "error", "errorType": ..., "error": ...}``). The routes sit behind the same
middleware as the rest of the API: tokens, the per-caller bound on running queries, the
query time limit. Parameters Prometheus defines but this API does not read (``timeout``,
``stats``) are ignored, as Prometheus ignores unknown ones.
"""

from __future__ import annotations

import logging
import math
import re
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from multidict import MultiDict
from pymongo.errors import PyMongoError

from ingest.api import prom_stats
from ingest.api.prom_store import (
    NAME,
    Labels,
    Matcher,
    Series,
    TooManySamples,
    read_samples,
    read_series,
)
from ingest.api.promql import (
    MAX_POINTS_PER_SERIES,
    Evaluator,
    Matrix,
    PromError,
    Scalar,
    Steps,
    Vector,
    bad_data,
    matchers_of,
    parse,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ingest.api.read_queries import Layout
    from ingest.store.layout_queries import Pipeline

logger = logging.getLogger(__name__)
MAX_SAMPLES = 1_000_000  # samples one query may load (Prometheus: --query.max-samples)
DEFAULT_LOOKBACK_MS = 300_000
SERIES_WINDOW = timedelta(hours=24)  # /series, /labels, /label/.../values without start
_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
MIN_MS, MAX_MS = 0, 253_370_764_800_000  # 1970 to 9999, as the rest of the API


def answer(data: object, status: int = 200) -> web.Response:
    """A Prometheus success answer."""
    body = orjson.dumps({"status": "success", "data": data})
    return web.Response(body=body, status=status, content_type="application/json")


def error_answer(exc: PromError) -> web.Response:
    """A Prometheus error answer."""
    body = orjson.dumps({"status": "error", "errorType": exc.error_type, "error": exc.message})
    return web.Response(body=body, status=exc.status, content_type="application/json")


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it (Go's ``FormatFloat(f, 'f', -1, 64)``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    if "e" in text:
        text = format(Decimal(text), "f")
    return text.removesuffix(".0")


def parse_time(name: str, text: str) -> int:
    """A Prometheus time parameter (RFC 3339 or Unix seconds) in milliseconds."""
    try:
        ms = round(float(text) * 1000)
    except ValueError:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise bad_data(
                f'invalid parameter "{name}": cannot parse "{text[:64]}" to a valid timestamp'
            ) from None
        if when.tzinfo is None:
            raise bad_data(f'invalid parameter "{name}": "{text[:64]}" has no time zone') from None
        ms = round(when.timestamp() * 1000)
    if not MIN_MS <= ms < MAX_MS:
        raise bad_data(f'invalid parameter "{name}": {text[:64]} is outside 1970 to 9999')
    return ms


def parse_duration(name: str, text: str) -> int:
    """A Prometheus duration parameter (``5m``, ``1h30m`` or seconds) in milliseconds."""
    try:
        seconds = float(text)
    except ValueError:
        found = _DURATION.match(text)
        if not text or found is None:
            raise bad_data(
                f'invalid parameter "{name}": cannot parse "{text[:64]}" to a valid duration'
            ) from None
        return sum(int(g) * unit for g, unit in zip(found.groups(), _UNIT_MS, strict=True) if g)
    if not math.isfinite(seconds) or abs(seconds) > MAX_MS / 1000:
        raise bad_data(
            f'invalid parameter "{name}": cannot parse "{text[:64]}" to a valid duration'
        )
    return round(seconds * 1000)


type Run = Callable[[Pipeline], Awaitable[list[dict[str, Any]]]]


class PromApi:
    """The handlers over one collection: ``run`` runs a pipeline on it (with its limits)."""

    def __init__(
        self,
        run: Run,
        layout: Layout,
        clock: Callable[[], datetime],
        query_timeout: float,
        *,
        use_stats: bool = True,
    ) -> None:
        self.run = run
        self.layout = layout
        self.use_stats = use_stats and layout.bucket
        self.clock = clock
        self.query_timeout = query_timeout

    def add_routes(self, app: web.Application) -> None:
        """Register the routes, GET and POST, named ``prom-...``."""
        for path, handler, name in (
            ("/api/v1/query", self.query, "prom-query"),
            ("/api/v1/query_range", self.query_range, "prom-query-range"),
            ("/api/v1/series", self.series, "prom-series"),
            ("/api/v1/labels", self.labels, "prom-labels"),
            ("/api/v1/label/{name}/values", self.label_values, "prom-label-values"),
            ("/api/v1/metadata", self.metadata, "prom-metadata"),
        ):
            wrapped = self._wrap(handler)
            app.router.add_get(path, wrapped, name=name)
            app.router.add_post(path, wrapped, name=f"{name}-post")

    def _wrap(
        self, handler: Callable[[MultiDict[str], web.Request], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def run(request: web.Request) -> web.Response:
            params: MultiDict[str] = MultiDict(request.query)
            if request.method == "POST":
                for key, value in (await request.post()).items():
                    if isinstance(value, str):
                        params.add(key, value)
            try:
                return await handler(params, request)
            except PromError as exc:
                return error_answer(exc)
            except TooManySamples:
                return error_answer(
                    PromError(
                        "execution",
                        "query processing would load too many samples into memory in query "
                        f"execution (at most {MAX_SAMPLES})",
                        422,
                    )
                )
            except (PyMongoError, TimeoutError) as exc:
                logger.warning("query failed: %s: %s", type(exc).__name__, str(exc)[:200])
                return error_answer(
                    PromError(
                        "timeout" if isinstance(exc, TimeoutError) else "unavailable",
                        "MongoDB did not answer in time or refused the query "
                        f"(--query-timeout {self.query_timeout:g})",
                        503,
                    )
                )

        return run

    async def fetch(self, matchers: list[Matcher], start_ms: int, end_ms: int) -> list[Series]:
        """The samples of the selected series in ``(start, end]``."""
        return await read_samples(self.run, self.layout, matchers, start_ms, end_ms, MAX_SAMPLES)

    def now_ms(self) -> int:
        """The API's clock in milliseconds."""
        return round(self.clock().timestamp() * 1000)

    def _lookback(self, params: MultiDict[str]) -> int:
        text = params.get("lookback_delta")
        if not text:
            return DEFAULT_LOOKBACK_MS
        ms = parse_duration("lookback_delta", text)
        if ms <= 0:
            raise bad_data('invalid parameter "lookback_delta": must be positive')
        return ms

    @staticmethod
    def _query(params: MultiDict[str]) -> Any:  # noqa: ANN401 - a parser node
        text = params.get("query")
        if not text:
            raise bad_data('invalid parameter "query": a query is needed')
        return parse(text)

    async def evaluate(self, node: Any, steps: Steps) -> Scalar | Vector | Matrix:  # noqa: ANN401
        """Evaluate a parsed query over the steps."""
        stats = None
        if self.use_stats:
            stats = prom_stats.Source(self.run, self.layout, self.fetch).over_time
        return await Evaluator(steps, self.fetch, stats).eval(node)

    async def query(self, params: MultiDict[str], _request: web.Request) -> web.Response:
        """``/api/v1/query``: an instant query."""
        node = self._query(params)
        text = params.get("time")
        t = parse_time("time", text) if text else self.now_ms()
        value = await self.evaluate(node, Steps([t], self._lookback(params)))
        seconds = t / 1000
        if isinstance(value, Scalar):
            return answer(
                {"resultType": "scalar", "result": [seconds, format_value(value.values[0])]}
            )
        if isinstance(value, Matrix):
            return answer(
                {"resultType": "matrix", "result": [_matrix_entry(s) for s in value.series]}
            )
        result = [
            {"metric": dict(labels), "value": [seconds, format_value(column[0])]}
            for labels, column in sorted(value.series.items())
            if column[0] is not None
        ]
        return answer({"resultType": "vector", "result": result})

    async def query_range(self, params: MultiDict[str], _request: web.Request) -> web.Response:
        """``/api/v1/query_range``: a range query."""
        node = self._query(params)
        for name in ("start", "end", "step"):
            if not params.get(name):
                raise bad_data(f'invalid parameter "{name}": it is needed')
        start, end = parse_time("start", params["start"]), parse_time("end", params["end"])
        step = parse_duration("step", params["step"])
        if end < start:
            raise bad_data('invalid parameter "end": end timestamp must not be before start time')
        if step <= 0:
            raise bad_data(
                'invalid parameter "step": zero or negative query resolution step widths are '
                "not accepted. Try a positive integer"
            )
        if (end - start) // step + 1 > MAX_POINTS_PER_SERIES:
            raise bad_data(
                "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing "
                "the query resolution (?step=XX)"
            )
        times = list(range(start, end + 1, step))
        value = await self.evaluate(node, Steps(times, self._lookback(params), step, end))
        return answer({"resultType": "matrix", "result": range_result(value, times)})

    def _window(self, params: MultiDict[str]) -> tuple[int, int]:
        end = parse_time("end", params["end"]) if params.get("end") else self.now_ms()
        default = end - int(SERIES_WINDOW.total_seconds() * 1000)
        start = parse_time("start", params["start"]) if params.get("start") else default
        if end < start:
            raise bad_data('invalid parameter "end": end timestamp must not be before start time')
        return start, end

    def _selections(self, params: MultiDict[str], required: bool) -> list[list[Matcher]]:
        found = params.getall("match[]", [])
        if not found and required:
            raise bad_data("no match[] parameter provided")
        out = []
        for text in found:
            node = parse(text)
            if not hasattr(node, "matchers") or not hasattr(node, "offset"):
                raise bad_data(f'invalid parameter "match[]": {text[:64]} is not a selector')
            out.append(matchers_of(node))
        return out or [[]]

    async def _series(
        self, params: MultiDict[str], required: bool
    ) -> tuple[list[Any], dict[str, str]]:
        start, end = self._window(params)
        found: set[Any] = set()
        units: dict[str, str] = {}
        for matchers in self._selections(params, required):
            labels, more = await read_series(self.run, self.layout, matchers, start, end)
            found.update(labels)
            units |= more
        return sorted(found), units

    async def series(self, params: MultiDict[str], _request: web.Request) -> web.Response:
        """``/api/v1/series``: the label sets of the selected series."""
        labels, _ = await self._series(params, required=True)
        return answer([dict(one) for one in labels])

    async def labels(self, params: MultiDict[str], _request: web.Request) -> web.Response:
        """``/api/v1/labels``: label names."""
        labels, _ = await self._series(params, required=False)
        return answer(sorted({name for one in labels for name, _ in one}))

    async def label_values(self, params: MultiDict[str], request: web.Request) -> web.Response:
        """``/api/v1/label/<name>/values``: a label's values."""
        name = request.match_info["name"]
        labels, _ = await self._series(params, required=False)
        return answer(sorted({v for one in labels for k, v in one if k == name}))

    async def metadata(self, params: MultiDict[str], _request: web.Request) -> web.Response:
        """``/api/v1/metadata``: every measurement as a gauge, its unit as stored."""
        metric = params.get("metric")
        matchers = [Matcher.make(NAME, "=", metric)] if metric else []
        start, end = self._window(params)
        labels, units = await read_series(self.run, self.layout, matchers, start, end)
        limit = int(params["limit"]) if params.get("limit", "").isdigit() else None
        names = sorted({dict(one)[NAME] for one in labels})[:limit]
        return answer(
            {
                n: [
                    {
                        "type": "gauge",
                        "help": f"the measurement {n} of the stored readings",
                        "unit": units.get(n, ""),
                    }
                ]
                for n in names
            }
        )


def range_result(value: Scalar | Vector | Matrix, times: list[int]) -> list[dict[str, Any]]:
    """A range query's ``result``: each series' points where it has a value."""
    if isinstance(value, Matrix):
        raise bad_data("a range query needs a scalar or an instant vector")
    columns: dict[Labels, list[float | None]] = (
        {(): list[float | None](value.values)} if isinstance(value, Scalar) else value.series
    )
    result = []
    for labels, column in sorted(columns.items()):
        points = [
            [t / 1000, format_value(v)] for t, v in zip(times, column, strict=True) if v is not None
        ]
        if points:
            result.append({"metric": dict(labels), "values": points})
    return result


def _matrix_entry(series: Series) -> dict[str, Any]:
    return {
        "metric": dict(series.labels),
        "values": [
            [t / 1000, format_value(v)] for t, v in zip(series.times, series.values, strict=True)
        ],
    }
