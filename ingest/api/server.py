"""``ingest api``: a read-only HTTP API over either layout, its page, and its own metrics.

    GET /api/sensors   the series (sensor and tags) that reported in a window: measurements,
                       last seen, units, descriptive tags
    GET /api/readings  raw readings of some series in a window, paged with a cursor
    GET /api/series    min/avg/max/count per series and step (bucket statistics when they fit)
    GET /api/rejects   the latest rejections and their count by reason
    GET /api/info      the layout served, the Grafana address and the order of the
                       page's charts (for the page)
    GET /openapi.json  the OpenAPI 3.1 description of the endpoints above
    GET /              the page; /static/ its files
    GET /metrics, /healthz, /readyz
    POST /login, /logout  the page's session (a cookie) from a token

With ``--api-tokens-file`` every route but the page, its files, the health checks and the
login needs ``Authorization: Bearer <token>`` or the page's session cookie
(:mod:`ingest.api.auth`); each caller may have ``--api-max-concurrent-queries`` queries
running at once.

The queries live in :mod:`ingest.api.read_queries` (pure), the parameters in
:mod:`ingest.api.query_params`. Every answer is bounded (a limit, a cursor, a most number of
points) and every bad parameter is a 400 with ``{"error": {"parameter": ..., "message": ...}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus, urlsplit

import orjson
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from ingest import __version__
from ingest.api import openapi, read_queries
from ingest.api.auth import COOKIE, CallerSlots, Sessions
from ingest.api.chart_order import measurement_order
from ingest.api.prom_http import PromApi
from ingest.api.query_params import (
    ENDPOINT_PARAMETERS,
    LIMITS,
    MAX_POINTS,
    ParamError,
    Params,
    encode_cursor,
)
from ingest.api.read_queries import Cursor, Layout, Selection
from ingest.api.remote_read import RemoteRead
from ingest.config import server_tls_context
from ingest.errors import ConfigError, StartupError
from ingest.metrics import API_ENDPOINTS, ApiMetrics
from ingest.tokens import TokenSet

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable

    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.config import ApiSettings
    from ingest.store.layout_queries import Pipeline

logger = logging.getLogger(__name__)
WEB = Path(__file__).parent / "web"
DASHBOARD_PATH = "/d/iot-sensors/sensors"
type Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Routes anyone may reach: the page and its files hold no data, the health checks say
# nothing about it, and the login is how the page gets a session. Everything else (the
# /api/ routes, /openapi.json, /metrics, and unknown paths) needs a token.
OPEN_ROUTES = frozenset({"page", "static", "health", "health-ready", "login", "logout", "session"})
QUERY_ROUTES = frozenset({"sensors", "readings", "series", "rejects"})  # run MongoDB queries
# The Prometheus query API's routes (ingest.api.prom_http) all run MongoDB queries too.
PROM_PREFIX = "prom-"


def json_response(body: object, status: int = 200) -> web.Response:
    """A JSON answer (orjson)."""
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def json_error(status: int, message: str, parameter: str | None = None) -> web.Response:
    """One JSON error object; ``parameter`` names the bad query parameter of a 400."""
    error: dict[str, str] = {"message": message}
    if parameter is not None:
        error = {"parameter": parameter, **error}
    return json_response({"error": error}, status)


class ReadApi:
    """The handlers over one collection (one layout) and the rejects collection."""

    def __init__(
        self,
        settings: ApiSettings,
        client: AsyncMongoClient[dict[str, Any]],
        metrics: ApiMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.client = client
        db = client[settings.db]
        self.collection: AsyncCollection[dict[str, Any]] = db[settings.collection]
        self.rejects: AsyncCollection[dict[str, Any]] = db[settings.rejects_collection]
        self.layout = Layout(settings.mode, settings.bucket_span_seconds)
        self.metrics = metrics or ApiMetrics()
        self.clock = clock
        self._max_time_ms = int(settings.query_timeout * 1000)
        self._openapi = openapi.description(__version__)
        self.tokens = TokenSet(settings.tokens)
        self.sessions = Sessions(settings.session_hours * 3600)
        self.slots = CallerSlots(settings.max_concurrent_queries)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._observe, self._guard])
        app.router.add_post("/login", self.login, name="login")
        app.router.add_post("/logout", self.logout, name="logout")
        app.router.add_get("/session", self.session, name="session")
        get = app.router.add_get
        get("/api/sensors", self.sensors, name="sensors")
        get("/api/readings", self.readings, name="readings")
        get("/api/series", self.series, name="series")
        get("/api/rejects", self.rejects_handler, name="rejects")
        get("/api/info", self.info, name="info")
        get("/openapi.json", self.openapi, name="openapi")
        get("/", self.page, name="page")
        get("/healthz", self.healthz, name="health")
        get("/readyz", self.readyz, name="health-ready")
        get("/metrics", self.metrics_handler, name="metrics")
        app.router.add_static("/static/", WEB, name="static")

        def run(pipeline: Pipeline) -> Awaitable[list[dict[str, Any]]]:
            return self.aggregate(self.collection, pipeline)

        PromApi(run, self.layout, self.clock, self.settings.query_timeout).add_routes(app)
        RemoteRead(run, self.layout).add_routes(app)
        return app

    @web.middleware
    async def _observe(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Errors as JSON, and the latency of every request by endpoint and status class."""
        start = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
        except ParamError as exc:
            response = json_error(400, exc.message, exc.parameter)
        except web.HTTPException as exc:
            response = json_error(exc.status, exc.reason)
        except (PyMongoError, TimeoutError) as exc:
            logger.warning("query failed: %s: %s", type(exc).__name__, str(exc)[:200])
            response = json_error(503, "MongoDB did not answer in time or refused the query")
        except Exception:
            logger.exception("request %s failed", request.path)
            response = json_error(500, "internal error (logged by the API)")
        status = response.status
        route = request.match_info.route.name or "other"
        endpoint = "health" if route.startswith("health") else route
        endpoint = "promql" if route.startswith(PROM_PREFIX) else endpoint
        endpoint = endpoint if endpoint in API_ENDPOINTS else "other"
        klass = "5xx" if status >= 500 else "4xx" if status >= 400 else "2xx"
        self.metrics.request_seconds.labels(endpoint, klass).observe(time.perf_counter() - start)
        return response

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A token (or the page's session) where one is needed; a slot per caller's query."""
        route = request.match_info.route.name
        caller: str | None = None
        if self.tokens and route not in OPEN_ROUTES:
            caller = self.caller(request)
            if caller is None:
                return self.unauthorized(request)
            logger.debug("%s %s by token %s", request.method, request.path, caller)
        if route not in QUERY_ROUTES and not (route or "").startswith(PROM_PREFIX):
            return await handler(request)
        key = f"token {caller}" if caller is not None else f"address {request.remote}"
        if not self.slots.take(key):
            limit = self.slots.limit
            response = json_error(
                429,
                f"{limit} queries of this caller are running "
                f"(--api-max-concurrent-queries {limit}): retry "
                "when one has answered",
            )
            response.headers["Retry-After"] = "1"
            return response
        try:
            return await handler(request)
        finally:
            self.slots.give_back(key)

    def caller(self, request: web.Request) -> str | None:
        """The name of the token of a request: its bearer token, else its session."""
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, token = header.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return None
            return self.tokens.name_of(token.strip())
        session = request.cookies.get(COOKIE)
        return self.sessions.name_of(session) if session else None

    def unauthorized(self, request: web.Request) -> web.Response:
        """401 without data, with the challenge of RFC 6750."""
        presented = "Authorization" in request.headers or COOKIE in request.cookies
        if presented:
            logger.info(
                "refused %s %s from %s: unknown token or expired session",
                request.method,
                request.path,
                request.remote,
            )
        response = json_error(
            401,
            "this API needs a token: Authorization: Bearer <token> "
            "(a token of its --api-tokens-file), or the page's login",
        )
        challenge = 'Bearer realm="ingest api"'
        if "Authorization" in request.headers:
            challenge += ', error="invalid_token"'
        response.headers["WWW-Authenticate"] = challenge
        return response

    async def login(self, request: web.Request) -> web.Response:
        """``POST /login`` (form field ``token``): a session cookie for the page."""
        refused = self.cross_site(request)
        if refused is not None:
            return refused
        if not self.tokens:
            return json_error(
                400, "this API takes no tokens (no --api-tokens-file): nothing to log in to"
            )
        form = await request.post()
        token = form.get("token")
        name = self.tokens.name_of(token.strip()) if isinstance(token, str) else None
        if name is None:
            logger.warning("page login refused from %s: unknown token", request.remote)
            response = json_error(401, "unknown token")
            response.headers["WWW-Authenticate"] = 'Bearer realm="ingest api"'
            return response
        session = self.sessions.open(name)
        logger.info("page login with token %s from %s", name, request.remote)
        if "application/json" in request.headers.get("Accept", ""):
            response = json_response({"name": name})
        else:  # the form without JavaScript: back to the page
            response = web.Response(status=303, headers={"Location": "./"})
        response.set_cookie(
            COOKIE,
            session,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
            max_age=int(self.settings.session_hours * 3600),
        )
        return response

    async def session(self, request: web.Request) -> web.Response:
        """``GET /session``: whether this API takes tokens, and the session's token name."""
        cookie = request.cookies.get(COOKIE)
        name = self.sessions.name_of(cookie) if cookie and self.tokens else None
        return json_response({"tokens": bool(self.tokens), "name": name})

    async def logout(self, request: web.Request) -> web.Response:
        """``POST /logout``: end the page's session."""
        refused = self.cross_site(request)
        if refused is not None:
            return refused
        session = request.cookies.get(COOKIE)
        if session:
            self.sessions.close(session)
        response = json_response({"logged_out": True})
        response.del_cookie(COOKIE, path="/")
        return response

    @staticmethod
    def cross_site(request: web.Request) -> web.Response | None:
        """403 for a POST whose Origin is not this API's (a cross-site form or script)."""
        origin = request.headers.get("Origin", "")
        if origin and urlsplit(origin).netloc.lower() == request.host.lower():
            return None
        logger.warning(
            "refused %s %s from %s: Origin %r is not this API's (%s)",
            request.method,
            request.path,
            request.remote,
            origin[:100],
            request.host[:100],
        )
        return json_error(403, "the Origin of this request is not this API's own address")

    def params(self, request: web.Request, endpoint: str) -> Params:
        """The request's parameters (only those ``endpoint`` reads), read at one instant."""
        query = request.query
        raw: dict[str, list[str]] = {}
        for pair in request.rel_url.raw_query_string.split("&"):
            name, _, value = pair.partition("=")
            raw.setdefault(unquote_plus(name), []).append(value)
        return Params(
            query,
            lambda name: query.getall(name, []),
            self.clock(),
            ENDPOINT_PARAMETERS[endpoint],
            raw=lambda name: raw.get(name, []),
        )

    async def aggregate(
        self, collection: AsyncCollection[dict[str, Any]], pipeline: Pipeline
    ) -> list[dict[str, Any]]:
        """Run a pipeline with the query time limit, on the server and here."""
        async with asyncio.timeout(self.settings.query_timeout + 1):
            cursor = await collection.aggregate(pipeline, maxTimeMS=self._max_time_ms)
            return await cursor.to_list()

    async def sensors(self, request: web.Request) -> web.Response:
        """``GET /api/sensors?since&until&search&limit&cursor``."""
        p = self.params(request, "sensors")
        since, until = p.window(timedelta(hours=24))
        search = p.search()
        limit = p.limit(*LIMITS["sensors"])
        after = p.sensor_cursor()
        docs = await self.aggregate(
            self.collection,
            read_queries.sensors(self.layout, since, until, after, limit, search),
        )
        more = len(docs) > limit
        docs = docs[:limit]
        return json_response(
            {
                "since": read_queries.iso(since),
                "until": read_queries.iso(until),
                "sensors": [read_queries.sensor_answer(d) for d in docs],
                "next": encode_cursor("s", *last_series(docs)) if more else None,
            }
        )

    async def readings(self, request: web.Request) -> web.Response:
        """``GET /api/readings?sensor&tag&since&until&measurement&limit&cursor``."""
        p = self.params(request, "readings")
        since, until = p.window(timedelta(hours=1))
        selection = Selection(p.sensors(), p.tags())
        measurements = p.measurements(required=False)
        limit = p.limit(*LIMITS["readings"])
        after = p.reading_cursor()
        # Rows sorted by series, time and _id; a time-series instant may span several
        # rows, so the last instant of a full fetch may be cut: it is fetched again with
        # the next rows. Bucket mode ends in one round (one row per instant).
        entries: list[tuple[read_queries.SeriesKey, int, dict[str, Any]]] = []
        fetch = limit + 2
        while True:
            rows = await self.aggregate(
                self.collection,
                read_queries.readings(
                    self.layout, selection, since, until, measurements, after, fetch
                ),
            )
            complete = len(rows) < fetch
            merged = read_queries.merge_rows(rows, complete)
            entries += merged
            if complete or len(entries) > limit:
                break
            if merged:
                after = Cursor(merged[-1][0], merged[-1][1])
            fetch *= 2
        page = entries[:limit]
        if measurements and not self.layout.bucket and page:
            await self._first_seqs(page)
        more = len(entries) > limit
        return json_response(
            {
                "since": read_queries.iso(since),
                "until": read_queries.iso(until),
                "readings": [
                    read_queries.reading_answer(key, doc, measurements) for key, _, doc in page
                ],
                "next": (
                    encode_cursor("r", page[-1][0].sensor_id, page[-1][0].tag_dict, page[-1][1])
                    if more
                    else None
                ),
            }
        )

    async def _first_seqs(
        self, page: list[tuple[read_queries.SeriesKey, int, dict[str, Any]]]
    ) -> None:
        """Set each reading's ``seq`` from its first document holding one (time-series)."""
        found = await self.aggregate(
            self.collection, read_queries.first_seqs([(k, ms) for k, ms, _ in page])
        )
        seqs = {
            (
                read_queries.series_key(d["_id"]["meta"]["sensor_id"], d["_id"]["meta"]),
                read_queries.to_ms(d["_id"]["ts"]),
            ): d["seq"]
            for d in found
        }
        for key, ms, doc in page:
            seq = seqs.get((key, ms))
            if seq is None:
                doc.pop("seq", None)
            else:
                doc["seq"] = seq

    async def series(self, request: web.Request) -> web.Response:
        """``GET /api/series?sensor&tag&measurement&since&until&step``."""
        p = self.params(request, "series")
        since, until = p.window(timedelta(hours=1), max_window=None)
        selection = Selection(p.sensors(), p.tags())
        sensor_ids = selection.sensor_ids
        measurements = p.measurements(required=True)
        step_ms = p.step_ms(60_000)
        low, high = read_queries.floor_ms(since, step_ms), read_queries.ceil_ms(until, step_ms)
        steps = (read_queries.to_ms(high) - read_queries.to_ms(low)) // step_ms
        points = steps * len(sensor_ids) * len(measurements)
        if points > MAX_POINTS:
            raise ParamError(
                "step",
                f"the answer would hold up to {points} points "
                f"({steps} steps x {len(sensor_ids)} sensors x "
                f"{len(measurements)} measurements); at most "
                f"{MAX_POINTS}: use a longer step or a shorter window",
            )
        source = "stats" if read_queries.uses_stats(self.layout, step_ms) else "readings"
        docs = await self.aggregate(
            self.collection,
            read_queries.series(self.layout, selection, measurements, low, high, step_ms),
        )
        answer = read_queries.series_answer(docs, sensor_ids, measurements)
        held = sum(len(s["points"]) for s in answer)
        if held > MAX_POINTS:  # sensors of many series: more than one series each
            raise ParamError(
                "step",
                f"the answer holds {held} points ({len(answer)} "
                f"series x measurements); at most {MAX_POINTS}: use a "
                "longer step, a shorter window or select series by tag",
            )
        self.metrics.series_source.labels(source).inc()
        return json_response(
            {
                "since": read_queries.iso(low),
                "until": read_queries.iso(high),
                "step_seconds": step_ms / 1000,
                "source": source,
                "series": answer,
            }
        )

    async def rejects_handler(self, request: web.Request) -> web.Response:
        """``GET /api/rejects?since&limit``: the latest rejections and counts by reason."""
        p = self.params(request, "rejects")
        since = p.time("since", p.now - timedelta(hours=1))
        limit = p.limit(*LIMITS["rejects"])
        latest, reasons = await asyncio.gather(
            self.aggregate(self.rejects, read_queries.rejects(since, limit)),
            self.aggregate(self.rejects, read_queries.reject_reasons(since)),
        )
        for doc in latest:
            doc["at"] = read_queries.iso(doc["at"])
        return json_response(
            {
                "since": read_queries.iso(since),
                "rejects": latest,
                "reasons": [{"reason": d["_id"], "count": d["count"]} for d in reasons],
            }
        )

    async def info(self, request: web.Request) -> web.Response:
        """``GET /api/info``: what this API serves, and where the Grafana dashboard is."""
        self.params(request, "info")  # it takes none: refuse any
        s = self.settings
        return json_response(
            {
                "mode": s.mode,
                "db": s.db,
                "collection": s.collection,
                "bucket_span_seconds": s.bucket_span_seconds if s.mode == "bucket" else None,
                "grafana_dashboard": (
                    s.grafana_url.rstrip("/") + DASHBOARD_PATH if s.grafana_url else None
                ),
                "measurement_order": measurement_order(s.page_order),
            }
        )

    async def openapi(self, _request: web.Request) -> web.Response:
        """``GET /openapi.json``: the OpenAPI description of the read API."""
        return json_response(self._openapi)

    async def page(self, _request: web.Request) -> web.FileResponse:
        """The page (``/``)."""
        return web.FileResponse(WEB / "index.html")

    async def healthz(self, _request: web.Request) -> web.Response:
        """Liveness: the process answers."""
        return web.Response(text="ok\n")

    async def readyz(self, _request: web.Request) -> web.Response:
        """Readiness: MongoDB answers a ping."""
        try:
            async with asyncio.timeout(2):
                await self.client.admin.command("ping")
        except (PyMongoError, TimeoutError):
            return web.Response(status=503, text="mongodb unreachable\n")
        return web.Response(text="ready\n")

    async def metrics_handler(self, _request: web.Request) -> web.Response:
        """Prometheus text exposition of the API's metrics."""
        body = generate_latest(self.metrics.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def check_layout(self) -> None:
        """Refuse to serve a collection of the other layout; a missing one is fine (empty)."""
        try:
            async with asyncio.timeout(5):
                cursor = await self.collection.database.list_collections(
                    filter={"name": self.settings.collection}
                )
                entries = await cursor.to_list()
        except (PyMongoError, TimeoutError) as exc:
            logger.warning(
                "cannot check %s.%s yet (%s); serving anyway",
                self.settings.db,
                self.settings.collection,
                type(exc).__name__,
            )
            return
        if not entries:
            logger.warning(
                "%s.%s does not exist yet: answers are empty until the daemon creates it",
                self.settings.db,
                self.settings.collection,
            )
            return
        info = entries[0]
        timeseries = info.get("type") == "timeseries" or "timeseries" in info.get("options", {})
        if timeseries != (self.settings.mode == "timeseries"):
            kind = "a time-series" if timeseries else "a regular (bucket)"
            raise ConfigError(
                f"--mode {self.settings.mode}: {self.settings.db}."
                f"{self.settings.collection} is {kind} collection; use --mode "
                f"{'timeseries' if timeseries else 'bucket'}"
            )


def last_series(docs: list[dict[str, Any]]) -> tuple[str, dict[str, str]]:
    """The sensor id and tags of the last row of a sensors page (its cursor)."""
    key = read_queries.sensor_key(docs[-1])
    return key.sensor_id, key.tag_dict


def api_client(settings: ApiSettings) -> AsyncMongoClient[dict[str, Any]]:
    """The driver client of the API (timezone-aware dates, its own app name)."""
    return AsyncMongoClient(
        settings.mongodb_uri,
        tz_aware=True,
        appname="ingest-api",
        connect=False,
        serverSelectionTimeoutMS=5000,
    )


def tls_context(settings: ApiSettings) -> ssl.SSLContext | None:
    """The server's TLS context from --api-tls-cert and --api-tls-key (TLS 1.2 at least)."""
    return server_tls_context(settings.tls_cert, settings.tls_key)


async def serve(
    settings: ApiSettings,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT when no event is given)."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
    client = api_client(settings)
    try:
        api = ReadApi(settings, client)
        await api.check_layout()
        runner = web.AppRunner(api.app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(
                runner, settings.host, settings.port, ssl_context=tls_context(settings)
            )
            try:
                await site.start()
            except OSError as exc:
                raise StartupError(
                    f"--api-port: cannot listen on {settings.host}:"
                    f"{settings.port} ({exc.strerror or exc}); choose another "
                    "port or stop what uses it"
                ) from None
            port = int(runner.addresses[0][1])
            scheme = "https" if settings.tls_cert else "http"
            logger.info(
                "read API (%s mode, %s.%s) on %s://%s:%d/",
                settings.mode,
                settings.db,
                settings.collection,
                scheme,
                settings.host,
                port,
            )
            if api.tokens:
                logger.info(
                    "%d API tokens (%s): /api/, /openapi.json and /metrics need one",
                    len(api.tokens.names),
                    ", ".join(api.tokens.names),
                )
            else:
                logger.warning(
                    "no --api-tokens-file: anyone who reaches %s:%d reads the data",
                    settings.host,
                    port,
                )
            if on_ready is not None:
                on_ready(port)
            await stop.wait()
        finally:
            await runner.cleanup()
    finally:
        await client.close()
    logger.info("stopped")
