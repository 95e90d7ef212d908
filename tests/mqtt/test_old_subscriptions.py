"""A restart with other topics or presets keeps none of the old subscriptions' messages.

The session is persistent, so the broker keeps every filter a client id ever subscribed.
Through the real broker and daemon: what comes through a filter not subscribed today
(its Subscription Identifier says so) is acknowledged, counted and not stored, and the
filters of the earlier run are unsubscribed, so the broker stops sending them at all.
"""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import time
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.client import topic_matches_sub
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ingest.config import Settings, parse_mqtt_url
from ingest.errors import WriteError
from ingest.metrics import Health, Metrics
from ingest.model import Inbound
from ingest.mqtt import source as source_module
from ingest.mqtt.source import MqttSource
from ingest.mqtt.subscriptions import (
    RETIRED_DAYS,
    Recalled,
    Subscriptions,
    identifier,
    topic_matcher,
)
from ingest.pipeline.subscribed import COLLECTION, SubscribedFilters
from tests.mqtt.test_paho_contract import KernelSocket, publish_packet, varint
from tests.support.mongo import COLLECTION as COLLECTION_OF
from tests.support.mongo import stored
from tests.support.procs import Broker, eventually
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Daemon

OLD = 'ingest_messages_skipped_total{reason="old_subscription"}'


def reading(topic: str, sensor: str, second: int | None = None) -> tuple[str, str]:
    """One reading of ``sensor`` (at ``second``, or without a time: taken at arrival)."""
    payload: dict[str, Any] = {"sensor_id": sensor, "temp": 21.5}
    if second is not None:
        payload["ts"] = f"2026-01-01T00:00:{second:02d}Z"
    return topic, json.dumps(payload)


async def settled(proc: Daemon, db: Any, mode: str, last: str) -> dict[str, float]:
    """The daemon's metrics once the reading of ``last`` (the sensor of the message
    published last) is stored and every message received is acknowledged."""
    key = "meta.sensor_id" if mode == "timeseries" else "sensor_id"
    await eventually(lambda: db[COLLECTION_OF[mode]].find_one({key: last}))

    def check() -> dict[str, float] | None:
        metrics = proc.metrics()
        received = metrics.get("ingest_messages_received_total", 0.0)
        return (
            metrics
            if received and metrics.get("ingest_messages_acked_total", 0.0) == received
            else None
        )

    result: dict[str, float] = await eventually(check)
    return result


async def test_a_restart_with_another_topic_stores_nothing_of_the_old_one(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str, mode: str
) -> None:
    old, new = f"{topic_root}/old", f"{topic_root}/new"
    first = daemon("--topic", f"{old}/#", rule_topics=True)
    assert first.stop() == 0
    await publish([reading(f"{old}/x", "queued", 1)])  # queued through old/# while away
    second = daemon("--topic", f"{new}/#", rule_topics=True)
    # old/# is unsubscribed now: a new message there does not even arrive.
    await publish([reading(f"{old}/y", "live", 2), reading(f"{new}/x", "new", 3)])
    metrics = await settled(second, db, mode, "new")
    assert await stored(db, mode) == 1  # only new/x
    assert metrics["ingest_messages_received_total"] == 2  # the queued old/x and new/x
    assert metrics[OLD] == 1
    assert metrics['ingest_messages_skipped_total{reason="unidentified_subscription"}'] == 0
    assert "unsubscribed from " + f"{old}/#" in second.logs()
    assert second.stop() == 0
    record = await db[COLLECTION].find_one({"client_id": f"ingest-{topic_root}"})
    assert record is not None
    assert record["filters"] == [f"{new}/#"]


async def test_what_an_old_filter_queued_for_todays_topics_is_stored_once(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str, mode: str
) -> None:
    """Another filter for the same topics (``root/#`` then ``root/+/+``): what the old
    one queued while the daemon was away has no other copy, and is stored (readings
    without a time, so a second copy would be a second reading); live ones come once."""
    first = daemon("--topic", f"{topic_root}/#", rule_topics=True)
    assert first.stop() == 0
    await publish([reading(f"{topic_root}/q{n}/r", f"q{n}") for n in range(3)])
    second = daemon("--topic", f"{topic_root}/+/+", rule_topics=True)
    await publish([reading(f"{topic_root}/live/r", "live")])
    metrics = await settled(second, db, mode, "live")
    await eventually(lambda: second.metric("ingest_messages_acked_total") >= 4)
    assert await stored(db, mode) == 4
    assert second.metrics()["ingest_messages_received_total"] == 4
    assert metrics[OLD] == 0
    assert "unsubscribed from " + f"{topic_root}/#" in second.logs()
    assert second.stop() == 0


async def test_what_an_old_filter_queued_is_stored_after_a_crash_before_its_write(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str, mode: str
) -> None:
    """The start that unsubscribes an old filter takes what it had queued, and is killed
    before writing it: the broker resends those messages (still through the old filter,
    as its identifier says) to the next start, which must store them, not skip them as
    another filter's."""
    first = daemon("--topic", f"{topic_root}/#", rule_topics=True)
    assert first.stop() == 0
    await publish([reading(f"{topic_root}/q{n}/r", f"q{n}") for n in range(3)])
    # A batch that closes only after a minute: taken, never written.
    second = daemon("--topic", f"{topic_root}/+/+", "--flush-interval", "60", rule_topics=True)
    await eventually(lambda: second.metric("ingest_messages_received_total") >= 3)
    assert "unsubscribed from " + f"{topic_root}/#" in second.logs()
    second.signal(signal.SIGKILL)
    second.wait()
    assert await stored(db, mode) == 0
    third = daemon("--topic", f"{topic_root}/+/+", rule_topics=True)
    await eventually(lambda: third.metric("ingest_messages_acked_total") >= 3)
    assert await stored(db, mode) == 3
    assert third.metrics()[OLD] == 0
    assert "unsubscribed from" not in third.logs()  # the second start did that
    assert third.stop() == 0
    record = await db[COLLECTION].find_one({"client_id": f"ingest-{topic_root}"})
    assert record is not None
    assert record["filters"] == [f"{topic_root}/+/+"]
    assert [entry["filter"] for entry in record["retired"]] == [f"{topic_root}/#"]
    # Wanted again: subscribed, and no longer retired.
    fourth = daemon("--topic", f"{topic_root}/#", rule_topics=True)
    assert fourth.stop() == 0
    record = await db[COLLECTION].find_one({"client_id": f"ingest-{topic_root}"})
    assert record is not None
    assert record["filters"] == [f"{topic_root}/#"]
    assert [entry["filter"] for entry in record["retired"]] == [f"{topic_root}/+/+"]


async def test_a_restart_with_another_filter_unsubscribes_the_old_one_before_its_suback(
    daemon: Callable[..., Daemon],
    broker: Broker,
    publish: Callable[..., Any],
    db: Any,
    topic_root: str,
    mode: str,
) -> None:
    """Readings without a time of their own published while the new SUBACK is on its way
    (a proxy holds it, as a resumed session's backlog ahead of it would) are stored once:
    the old filter's UNSUBSCRIBE went out with the new SUBSCRIBE, not after its SUBACK,
    so the broker sends them through the new filter alone."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    through = f"mqtt://127.0.0.1:{proxy.port}"  # the broker the filters are recorded for
    try:
        first = daemon("--topic", f"{topic_root}/#", rule_topics=True, broker_url=through)
        assert first.stop() == 0
        proxy.hold_replies()
        second = daemon(
            "--topic", f"{topic_root}/+/+", rule_topics=True, broker_url=through, wait_ready=False
        )
        chunks = proxy.client_chunks
        await eventually(lambda: proxy.client_chunks >= chunks + 2)  # CONNECT, its requests
        await asyncio.sleep(0.5)  # (the requests may come in two reads)
        await publish([reading(f"{topic_root}/held{n}/r", f"held{n}") for n in range(4)])
        proxy.hold_replies(hold=False)
        await settled(second, db, mode, "held3")
        await eventually(lambda: second.metric("ingest_messages_acked_total") >= 4)
        assert await stored(db, mode) == 4
        assert second.metrics()["ingest_messages_received_total"] == 4
        assert second.stop() == 0
    finally:
        proxy.stop()


def received(proc: Daemon) -> float:
    """The messages ``proc`` received, 0 until its metrics answer."""
    try:
        return proc.metric("ingest_messages_received_total")
    except OSError:
        return 0.0


async def test_a_refused_new_filter_leaves_the_old_one_subscribed(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], topic_root: str, tmp_path: Path
) -> None:
    """The old filter's UNSUBSCRIBE goes out with today's SUBSCRIBE: when the broker
    refuses today's (here: grants QoS 0 only), the old filter is subscribed again, so
    the session goes on queueing its messages for a start that works."""
    capped = Broker(tmp_path, extra="max_qos 0\nqueue_qos0_messages true\n")
    capped.start()
    try:
        first = daemon(
            "--topic", f"{topic_root}/#", rule_topics=True, broker_url=capped.url, wait_ready=False
        )
        await eventually(lambda: "broker answered [0]" in first.logs())
        assert first.stop() == 0  # the session holds <root>/#, and its record says so
        second = daemon(
            "--topic",
            f"{topic_root}/+/+",
            rule_topics=True,
            broker_url=capped.url,
            wait_ready=False,
        )
        await eventually(lambda: "broker answered [0]" in second.logs())
        assert second.stop() == 0
        # On the old filter only: queued if the session still holds it.
        await publish([reading(f"{topic_root}/old", "old")], qos=0, to=capped)
        third = daemon(
            "--topic",
            f"{topic_root}/+/+",
            rule_topics=True,
            broker_url=capped.url,
            wait_ready=False,
        )
        await eventually(lambda: received(third) >= 1)
        assert third.stop() == 0
    finally:
        capped.stop()


async def test_workers_restarted_with_another_filter_switch_together(
    daemon: Callable[..., Daemon],
    broker: Broker,
    publish: Callable[..., Any],
    db: Any,
    topic_root: str,
) -> None:
    """Each worker's session holds the old shared filter: one worker switching to the new
    one while another is still coming up (its session resumed, its CONNACK not read yet)
    would have a message come through both, the old filter's copy to the slow worker.
    The first worker waits for the other before subscribing, so readings without a time
    published meanwhile are stored once."""
    client_id = f"ingest-{topic_root}"
    proxy = Proxy("127.0.0.1", broker.port).start()
    through = f"mqtt://127.0.0.1:{proxy.port}"  # the broker the filters are recorded for
    try:
        first = daemon(
            "--workers", "2", "--topic", f"{topic_root}/#", rule_topics=True, broker_url=through
        )
        assert first.stop() == 0
        proxy.slow_client(f"{client_id}-w1", seconds=4.0)  # worker 1, for a while
        second = daemon(
            "--workers",
            "2",
            "--topic",
            f"{topic_root}/+/+",
            rule_topics=True,
            broker_url=through,
            wait_ready=False,
        )
        # Both sessions are resumed, worker 0 is connected (and, alone, would have
        # switched by now), worker 1 has yet to read its CONNACK.
        await eventually(lambda: len(proxy.connects) >= 2)
        await asyncio.sleep(1.0)
        await publish([reading(f"{topic_root}/wait{n}/r", f"wait{n}") for n in range(4)])
        # Ready: both workers subscribed, what reached worker 1 before its SUBACK read.
        await eventually(lambda: second.readyz() == 200, timeout=30)
        await settled(second, db, "bucket", "wait3")
        await eventually(lambda: second.metric("ingest_messages_acked_total") >= 4)
        assert await stored(db, "bucket") == 4
        assert second.stop() == 0
    finally:
        proxy.stop()


async def test_a_retired_filter_is_forgotten_after_its_days(db: Any) -> None:
    """Through the real driver: the record keeps a filter unsubscribed for RETIRED_DAYS
    days, then leaves it out."""
    memory = SubscribedFilters(db[COLLECTION], "c", "b:1883")
    assert await memory.recall() is None
    now = time.time()
    old, recent = now - (RETIRED_DAYS * 86400 + 60), now - (RETIRED_DAYS * 86400 - 60)
    await memory.record(["a/#"], {"b/#": old, "c/#": recent})
    recalled = await memory.recall()
    assert recalled is not None
    assert recalled.filters == ["a/#"]
    assert list(recalled.retired) == ["c/#"]
    assert recalled.retired["c/#"] == pytest.approx(recent, abs=0.001)  # BSON: ms


async def test_presets_then_the_default_format_store_a_reading_once(
    daemon: Callable[..., Daemon],
    persistent: Broker,
    db: Any,
    mode: str,
    publish: Callable[..., Any],
) -> None:
    """``--preset zigbee2mqtt --preset shelly`` subscribes ``+/+/#``, which covers
    ``sensors/<id>``; the default format then subscribes ``sensors/#``. Without the
    record of the earlier filters (a session from before it), the broker sends a reading
    once per subscription: the copy through ``+/+/#`` is skipped; with it, ``+/+/#`` is
    unsubscribed and the reading comes once."""
    url = persistent.url
    for known in (False, True):
        presets = daemon(
            "--preset",
            "zigbee2mqtt",
            "--preset",
            "shelly",
            broker_url=url,
            rule_topics=True,
            client_id="switching",
        )
        assert "subscribed to +/+/#" in presets.logs()
        assert presets.stop() == 0
        if not known:
            await db[COLLECTION].delete_many({})
        default = daemon(broker_url=url, rule_topics=True, client_id="switching")
        await publish([reading(f"sensors/s{known:d}", f"s{known:d}")], to=persistent)
        metrics = await settled(default, db, mode, f"s{known:d}")
        assert default.stop() == 0
        assert await stored(db, mode) == 1 + known  # one reading per round
        assert metrics["ingest_messages_received_total"] == (1 if known else 2)
        assert metrics[OLD] == (0 if known else 1)
    # Said at start: the rules' filters replace sensors/#, and how to keep it.
    assert (
        "instead of the default sensors/#, and no rule reads the default format" in presets.logs()
    )
    assert "instead of the default" not in default.logs()


async def test_workers_restarted_with_another_topic_store_nothing_of_the_old_one(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str
) -> None:
    old, new = f"{topic_root}/old", f"{topic_root}/new"
    first = daemon("--workers", "2", "--topic", f"{old}/#", rule_topics=True)
    assert first.stop() == 0
    # Queued in the two workers' sessions through the shared old/#.
    await publish([reading(f"{old}/x", f"q{n}", n) for n in range(6)])
    second = daemon("--workers", "2", "--topic", f"{new}/#", rule_topics=True)
    await publish([reading(f"{old}/y", "live", 10), reading(f"{new}/x", "new", 11)])
    await settled(second, db, "bucket", "new")
    # The queued messages may come after new/x (each worker reads its own session).
    await eventually(lambda: second.metric("ingest_messages_acked_total") >= 7)
    assert await stored(db, "bucket") == 1
    metrics = second.metrics()
    assert metrics["ingest_messages_received_total"] == 7  # not old/y: unsubscribed
    assert metrics[OLD] == 6
    assert second.stop() == 0


def test_a_filter_keeps_its_identifier_in_every_form() -> None:
    """Plain and shared forms share the identifier (a change of --workers keeps a
    filter's queued messages); the test of a message against today's filters."""
    today = Subscriptions(["$share/g/a/#", "b/+"])
    assert identifier("a/#") == identifier("$share/other/a/#") in today.wanted
    assert 1 <= identifier("x") <= 268_435_455
    assert today.unwanted("c/1", identifier("c/#")) == "old_subscription"
    # An old filter not remembered stays subscribed: its copies duplicate today's.
    assert today.unwanted("a/1", identifier("a/+")) == "old_subscription"
    # A remembered one, unsubscribed now: what it queued before today's filters existed
    # has no other copy, and is taken where today's filters match.
    today.retire(["a/+", "c/#", "b/+"])
    assert today.retired == {identifier("a/+"), identifier("c/#")}
    assert today.unwanted("a/1", identifier("a/+")) is None
    assert today.unwanted("c/1", identifier("c/#")) == "old_subscription"
    assert today.unwanted("a/1", (identifier("c/#"), identifier("x/#"))) is None
    assert today.unwanted("c/1", (identifier("c/#"), identifier("c/+"))) == "old_subscription"
    assert today.unwanted("a/1", (identifier("c/#"), identifier("a/#"))) is None
    assert today.unwanted("a/1", 0) is None  # no identifier: today's filter matches
    assert today.unwanted("c/1", 0) == "unidentified_subscription"


# Topic levels that exercise the matching rules: empty levels, "$" topics, characters a
# regular expression would read as syntax, and the wildcards themselves (in filters).
_LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$", ".*", "a+b", "(x)", "\n", "é"])
_TOPICS = st.lists(_LEVELS, min_size=1, max_size=5).map("/".join)
_FILTERS = st.builds(
    lambda levels, tail: "/".join(levels + tail),
    st.lists(st.one_of(_LEVELS, st.just("+")), max_size=4),
    st.sampled_from([[], ["#"], ["+"]]),
).filter(bool)


@given(filters=st.lists(_FILTERS, min_size=1, max_size=3), topic=_TOPICS)
def test_topics_match_filters_as_paho_matches_them(filters: list[str], topic: str) -> None:
    """A message without an identifier is taken when today's filters match its topic:
    the test agrees with paho's reference matcher (MQTT 5 §4.7: ``+``, a final ``#``
    with its parent level, no wildcard first for ``$`` topics)."""
    expected = any(topic_matches_sub(f, topic) for f in filters)
    assert topic_matcher(filters)(topic) is expected


def test_matching_topics_leaves_nothing_for_the_garbage_collector() -> None:
    """Every message through a subscription without identifier is matched: with 100,000
    sensors that is every message, and a reference cycle per match (paho's matcher
    leaves one) kept the collector busy for a tenth of the daemon's CPU."""
    today = Subscriptions(["sensors/#", "$share/g/meters/+/state"])
    gc.collect()
    gc.disable()
    try:
        skipped = [today.unwanted(f"sensors/s{i}/readings", 0) for i in range(20_000)]
        skipped += [today.unwanted(f"other/s{i}", 0) for i in range(100)]
        # (Six objects a match before: 121,200. Not 0: another thread may leave some.)
        assert gc.collect() < 1_000
    finally:
        gc.enable()
    assert skipped == [None] * 20_000 + ["unidentified_subscription"] * 100


class FailingMemory:
    """A record of the filters that MongoDB cannot read or write: fails, or never answers."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.calls = 0

    async def recall(self) -> Recalled | None:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        raise WriteError("no primary")

    async def record(self, filters: list[str], retired: dict[str, float]) -> None:
        raise AssertionError(f"not recalled, so not recorded: {filters}, {retired}")


@pytest.mark.parametrize("hang", [False, True])
async def test_a_record_mongodb_cannot_read_leaves_the_subscriptions_to_the_identifiers(
    broker: Broker,
    publish: Callable[..., Any],
    topic_root: str,
    hang: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MongoDB failing (or not answering) when the recorded filters are read: logged, and
    the daemon subscribes and consumes all the same (no unsubscribe of old filters)."""
    monkeypatch.setattr(source_module, "MEMORY_TIMEOUT", 0.2)
    settings = Settings(
        mqtt=parse_mqtt_url(broker.url), topics=(f"{topic_root}/#",), client_id=f"mem-{topic_root}"
    )
    memory = FailingMemory(hang)
    source = MqttSource(settings, Metrics("bucket"), Health(), memory=memory)
    got: list[Inbound] = []

    async def sink(message: Inbound) -> bool:
        got.append(message)
        return True

    task = asyncio.create_task(source.run(sink))
    try:
        await eventually(lambda: source._health.mqtt_connected)
        await publish([reading(f"{topic_root}/s1", "s1", 1)])
        await eventually(lambda: len(got) == 1)
    finally:
        source.release()
        await asyncio.wait_for(task, 10)
    assert memory.calls == 1
    assert "cannot read or record the filters client id" in caplog.text


@pytest.mark.parametrize(
    ("connack_properties", "identified", "skipped"),
    [
        (b"", True, [False, True, True]),  # identifiers taken (the property absent)
        (b"\x29\x00", False, [False, False, False]),  # Subscription Identifier Available 0
    ],
)
async def test_a_broker_without_identifiers_gets_nothing_skipped(
    connack_properties: bytes, identified: bool, skipped: list[bool]
) -> None:
    """A broker whose CONNACK says it takes no Subscription Identifiers: the source then
    subscribes without them and skips nothing. Otherwise a message without identifier is
    skipped when its topic is outside today's filters, and one with another filter's
    identifier always (no network: a hooked client fed the broker's bytes)."""
    source = MqttSource(Settings(topics=("a/#",)), Metrics("bucket"), Health())
    client = aiomqtt.Client("127.0.0.1", protocol=aiomqtt.ProtocolVersion.V5)
    inbox = source._receiver(client)
    paho: Any = client._client
    sock = KernelSocket(1448)
    paho._sock = sock
    body = bytes((1, 0, len(connack_properties))) + connack_properties
    sock.feed(bytes((0x20, len(body))) + body)
    old = b"\x0b" + varint(identifier("b/#"))
    for topic, props in (("a/1", b""), ("b/1", b""), ("a/2", old)):
        sock.feed(publish_packet(topic, b"{}", 0, 0, props=props))
    while sock.queue:
        paho.loop_read()
    assert inbox.identified is identified
    assert [type(message) is not Inbound for message in inbox.messages] == skipped


async def test_a_backlog_queued_through_subscriptions_without_identifiers_is_stored(
    daemon: Callable[..., Daemon],
    broker: Broker,
    publish: Callable[..., Any],
    db: Any,
    topic_root: str,
) -> None:
    """A session subscribed without Subscription Identifiers (by a version before them):
    what it queued on a filter still wanted is stored, what it queued on another filter
    is skipped, counted as unidentified."""
    client_id = f"ingest-{topic_root}"
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    async with aiomqtt.Client(
        "127.0.0.1",
        broker.port,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=True,
        properties=props,
    ) as earlier:
        for topic in (f"{topic_root}/new/#", f"{topic_root}/old/#"):
            await earlier.subscribe(topic, qos=1)
    await publish(
        [reading(f"{topic_root}/old/x", "dropped", 1), reading(f"{topic_root}/new/x", "kept", 2)]
    )  # the last one comes last
    proc = daemon("--topic", f"{topic_root}/new/#", rule_topics=True)
    metrics = await settled(proc, db, "bucket", "kept")
    assert await stored(db, "bucket") == 1
    assert metrics['ingest_messages_skipped_total{reason="unidentified_subscription"}'] == 1
    assert proc.stop() == 0
