"""Prometheus remote read (``POST /api/v1/read``): a Prometheus server's queries, answered.

The request is a snappy-compressed (block format) protobuf ``ReadRequest``; the answer a
snappy-compressed ``ReadResponse`` with the samples of every selected series in each
query's ``[start, end]`` (response type ``SAMPLES``, which is what Prometheus' remote read
client asks for). The series are those of the PromQL API (:mod:`ingest.api.prom_store`),
so a Prometheus server configured with ``remote_read`` evaluates its own queries,
recording rules and alerts over the stored readings. Errors are plain text with a 4xx or
5xx status, as Prometheus' own remote read endpoint answers them.

Snappy is ``cramjam``'s (maintained Rust bindings with wheels, no C build step).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import cramjam
from aiohttp import web
from google.protobuf.message import DecodeError
from pymongo.errors import PyMongoError

from ingest.api.prom_store import Matcher, MatcherError, TooManySamples, read_samples
from ingest.api.remote_read_pb import (
    MATCHER_OPS,
    SAMPLES,
    ReadRequest,
    ReadResponse,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ingest.api.read_queries import Layout
    from ingest.store.layout_queries import Pipeline

    type Run = Callable[[Pipeline], Awaitable[list[dict[str, Any]]]]

logger = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 1 << 20  # a compressed ReadRequest: matchers and times, never large
MAX_SAMPLES = 5_000_000  # samples of one request (all its queries)
MAX_QUERIES = 64


class Refused(Exception):  # noqa: N818 - named for what happens
    """A request answered with a plain-text error, as Prometheus' own endpoint answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def decode(body: bytes) -> Any:  # noqa: ANN401 - a ReadRequest message
    """The ReadRequest of a snappy-compressed body, or ValueError saying what is wrong."""
    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise ValueError(f"the body is not snappy-compressed (block format): {exc}") from None
    request = ReadRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise ValueError(f"the body is not a prometheus ReadRequest: {exc}") from None
    return request


class RemoteRead:
    """The remote read handler over one collection."""

    def __init__(self, run: Run, layout: Layout) -> None:
        self.run = run
        self.layout = layout

    def add_routes(self, app: web.Application) -> None:
        """Register ``POST /api/v1/read`` (route ``prom-read``)."""
        app.router.add_post("/api/v1/read", self.read, name="prom-read")

    async def read(self, request: web.Request) -> web.Response:
        """Answer a ReadRequest with the samples of each query."""
        try:
            read_request = await self.request_of(request)
            response = await self.samples(read_request)
        except Refused as exc:
            return web.Response(status=exc.status, text=exc.message + "\n")
        except (PyMongoError, TimeoutError) as exc:
            logger.warning("remote read failed: %s: %s", type(exc).__name__, str(exc)[:200])
            return web.Response(
                status=503, text="MongoDB did not answer in time or refused the query\n"
            )
        return web.Response(
            body=bytes(cramjam.snappy.compress_raw(response.SerializeToString())),
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
        )

    @staticmethod
    async def request_of(request: web.Request) -> Any:  # noqa: ANN401 - a ReadRequest
        """The request's ReadRequest, checked."""
        body = await request.content.read(MAX_REQUEST_BYTES + 1)
        if len(body) > MAX_REQUEST_BYTES:
            raise Refused(413, f"a remote read request may be at most {MAX_REQUEST_BYTES} bytes")
        try:
            read_request = decode(body)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        types = list(read_request.accepted_response_types)
        if types and SAMPLES not in types:
            raise Refused(
                400, "none of the accepted response types is served: this API answers SAMPLES"
            )
        if len(read_request.queries) > MAX_QUERIES:
            raise Refused(400, f"at most {MAX_QUERIES} queries in one request")
        return read_request

    async def samples(self, read_request: Any) -> Any:  # noqa: ANN401 - protobuf messages
        """The ReadResponse: each query's series and samples in ``[start, end]``."""
        response = ReadResponse()
        budget = MAX_SAMPLES
        for query in read_request.queries:
            try:
                matchers = [
                    Matcher.make(m.name, MATCHER_OPS[m.type], m.value) for m in query.matchers
                ]
                series = await read_samples(
                    self.run,
                    self.layout,
                    matchers,
                    query.start_timestamp_ms - 1,  # [start, end]: samples after start - 1 ms
                    query.end_timestamp_ms,
                    budget,
                )
            except (MatcherError, KeyError) as exc:
                raise Refused(400, f"a label matcher cannot be used: {exc}") from None
            except TooManySamples:
                raise Refused(
                    422, f"the request selects more than {MAX_SAMPLES} samples: ask for less"
                ) from None
            result = response.results.add()
            for s in series:
                budget -= len(s.times)
                out = result.timeseries.add()
                for name, value in s.labels:
                    out.labels.add(name=name, value=value)
                for t, v in zip(s.times, s.values, strict=True):
                    out.samples.add(value=v, timestamp=t)
        return response
