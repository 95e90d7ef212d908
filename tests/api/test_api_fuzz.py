"""No query string makes the read API answer 5xx: every bad parameter is a 400 naming it.

Hypothesis builds query strings for every endpoint out of the parameters' own forms
(times near the ends of what a datetime holds, epoch milliseconds of any length,
durations of any size, digits of other scripts, cursors of any content) and of arbitrary
text and bytes; each goes over HTTP to the real app serving both layouts of the fleet
of tests/api/test_api.py (the same store, both modes' documents).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_from_bytes

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from ingest.api.query_params import KNOWN_PARAMETERS
from loadgen.daemons import parse_metrics
from tests.api.test_api import NOW, fleet, serving, write_both

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ENDPOINTS = ("/api/sensors", "/api/readings", "/api/series", "/api/rejects", "/api/info")
# parameters an error may name though the request left them out: the required ones, and
# series' step (its default, 1m, over a long window is too many points)
IMPLIED = {"/api/readings": {"sensor"}, "/api/series": {"sensor", "measurement", "step"}}
REQUIRED = {"/api/readings": {"sensor"}, "/api/series": {"sensor", "measurement"}}

offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
# the ends of what a datetime holds, where a time zone or a subtraction overflows
ends = st.sampled_from(
    [
        datetime.min.replace(tzinfo=UTC),
        datetime.max.replace(tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(9998, 12, 31, 23, tzinfo=UTC),
    ]
)
isos = st.builds(
    lambda t, tz: t.replace(tzinfo=tz).isoformat(), ends | st.datetimes(), offsets | st.just(UTC)
)
near = st.builds(
    lambda s: (NOW + timedelta(seconds=s)).isoformat(), st.integers(-40 * 86400, 86400)
)
numbers = (
    st.integers(0, 10**25).map(str)
    | st.integers(10**13, 10**16).map(str)
    | st.decimals(0, 10**12, places=3).map(str)
    | st.text("0123456789", min_size=1, max_size=5000)
    | st.sampled_from(["²", "٣", "\uff11", "1e400", "-5", "0", "nan", "inf"])
)
durations = st.builds(
    lambda n, unit: n + unit, numbers, st.sampled_from(["", "ms", "s", "m", "h", "d", "w", "y"])
)
times = (
    isos
    | near
    | numbers
    | durations.map(lambda d: f"now-{d}")
    | st.sampled_from(["now", "now-1h", "now-30d", "now-32d", "", " now "])
)
names = st.lists(
    st.sampled_from(
        ["s1", "s2", "s3", "temp", "hum", "on", "state", "ts", "units", "a.b", "$where", "x" * 200]
    ),
    min_size=1,
    max_size=12,
).map(",".join)
json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["r", "s", "s1"])
    | st.dictionaries(
        st.text(max_size=8) | st.sampled_from(["room", "$gt", "a.b"]),
        st.text(max_size=8) | st.integers(-(2**63), 2**64 - 1),
        max_size=3,
    )
)  # what orjson can write
cursors = st.lists(json_leaves, max_size=5).map(
    lambda v: base64.urlsafe_b64encode(orjson.dumps(v)).decode().rstrip("=")
) | st.builds(
    lambda kind, rest: base64.urlsafe_b64encode(orjson.dumps([kind, *rest])).decode().rstrip("="),
    st.sampled_from(["r", "s"]),
    st.lists(json_leaves, max_size=3),
)
tags = st.lists(
    st.sampled_from(["room", "path", "sensor_id", "$where", "a.b", "", "x" * 70])
    | st.text(max_size=5),
    min_size=1,
    max_size=2,
).map(":".join) | st.text(max_size=20)
VALUES = {
    "since": times,
    "until": times,
    "step": durations | numbers,
    "limit": numbers,
    "sensor": names,
    "measurement": names,
    "cursor": cursors,
    "tag": tags,
}
anything = st.text(max_size=60).map(lambda t: quote(t, safe="")) | st.binary(max_size=40).map(
    lambda b: quote_from_bytes(b, safe="")
)


# a valid value of each parameter, so that one odd value meets otherwise valid requests
PLAUSIBLE = {
    "since": st.sampled_from(["now-3h", "now-90m", "2026-05-01T08:30:00Z", "1777622400000"]) | near,
    "until": st.sampled_from(["now", "2026-05-01T10:00:00+02:00"]) | near,
    "step": st.sampled_from(["1m", "10m", "1h", "90m", "2h", "1d", "365d", "500ms"]),
    "limit": st.integers(1, 1000).map(str),
    "sensor": st.just("s1,s2"),
    "measurement": st.just("temp,on,state"),
    "cursor": st.just(""),
    "tag": st.sampled_from(["room:kitchen", "room:hall"]),
}


@st.composite
def queries(draw: st.DrawFn) -> tuple[str, list[str], str]:
    """An endpoint, the parameter names given, and its encoded query string."""
    endpoint = draw(st.sampled_from(ENDPOINTS))
    plausible = {k: draw(v) for k, v in PLAUSIBLE.items()}
    if endpoint == "/api/series" and draw(st.booleans()):
        plausible["step"] = "1h"  # a series that always fits
        plausible["since"] = "now-6h"
    known = st.sampled_from(sorted(KNOWN_PARAMETERS))
    keys = draw(
        st.lists(
            st.one_of(known, known, known, st.text(min_size=1, max_size=10)),
            max_size=3,
            unique=True,
        )
    )
    values = {}
    for key in keys:
        odd = VALUES.get(key, anything).map(lambda v: quote(v, safe=""))
        values[key] = draw(st.one_of(odd, odd, odd, anything))
    if draw(st.booleans()):  # the rest valid, so the odd values reach the queries
        values = {
            k: quote(v, safe="")
            for k, v in plausible.items()
            if k != "cursor" and (k in REQUIRED.get(endpoint, ()) or draw(st.booleans()))
        } | values
    pairs = [f"{quote(k, safe='')}={v}" for k, v in values.items()]
    return endpoint, list(values), "&".join(pairs)


@pytest.fixture
async def urls(mongo: Any, db: Any, db_name: str) -> AsyncIterator[dict[str, str]]:
    await write_both(db, fleet())
    async with (
        serving(mongo, db_name, "bucket") as bucket,
        serving(mongo, db_name, "timeseries") as series,
    ):
        yield {"bucket": bucket, "timeseries": series}


async def test_no_query_string_gets_a_5xx(urls: dict[str, str]) -> None:
    loop = asyncio.get_running_loop()
    answers: dict[int, int] = {}
    async with aiohttp.ClientSession() as http:

        async def ask(url: str) -> tuple[int, Any]:
            async with http.get(URL(url, encoded=True)) as resp:
                body = await resp.read()
                with contextlib.suppress(orjson.JSONDecodeError):
                    return resp.status, orjson.loads(body)
                return resp.status, body

        # Its own count, whatever the profile: the check below needs enough of both kinds
        # of answer, and most generated query strings are refused.
        @settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow], database=None)
        @given(query=queries())
        def check(query: tuple[str, list[str], str]) -> None:
            endpoint, keys, text = query
            for base in urls.values():
                url = f"{base}{endpoint}?{text}"
                status, body = asyncio.run_coroutine_threadsafe(ask(url), loop).result(60)
                answers[status] = answers.get(status, 0) + 1
                assert status in {200, 400}, (url, status, body)
                if status == 400:
                    assert isinstance(body, dict), (url, body)
                    named = body["error"]["parameter"]
                    assert named in {*keys, *IMPLIED.get(endpoint, ())}, (url, body)

        await asyncio.to_thread(check)
        for base in urls.values():
            async with http.get(f"{base}/metrics") as resp:
                metrics = parse_metrics(await resp.text())
            errors = {
                k: v
                for k, v in metrics.items()
                if k.startswith("ingest_api_request_seconds_count") and "5xx" in k and v
            }
            assert errors == {}
    # the property saw both kinds of answer, not only refusals
    assert answers.get(200, 0) > 20, answers
    assert answers.get(400, 0) > 20, answers
