"""The MQTT bytes of the hot path: the Python functions and their compiled twins agree."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ingest.mqtt import _wire_py
from tests.mqtt.test_paho_contract import publish_packet, varint
from tests.support.twins import compiled

if TYPE_CHECKING:
    from collections.abc import Callable

twin = compiled("ingest.mqtt._wire_c")


@given(st.lists(st.integers(min_value=1, max_value=0xFFFF), max_size=300))
def test_pubacks_are_four_bytes_each_in_order_in_both_twins(mids: list[int]) -> None:
    expected = b"".join(struct.pack(">BBH", 0x40, 2, mid) for mid in mids)
    assert _wire_py.pubacks(mids) == expected
    assert twin.pubacks(mids) == expected


@pytest.mark.parametrize("mid", [0, -1, 0x10000, 2**70])
def test_a_packet_id_outside_the_range_is_refused_by_both_twins(mid: int) -> None:
    for pubacks in (_wire_py.pubacks, twin.pubacks):
        with pytest.raises(ValueError, match=f"packet id {mid} outside 1..65535"):
            pubacks([1, mid])


# --- scanning a read buffer into PUBLISH packets -------------------------------------


def remaining_length(n: int, extra: int = 0) -> bytes:
    """``n`` as a variable byte integer, padded with ``extra`` non-minimal bytes (which
    the scanner accepts, as paho's reader does, up to 4 bytes in all)."""
    out = bytearray(varint(n))
    for _ in range(extra):
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


# Pieces of a PUBLISH's property block, whole or cut: Subscription Identifiers of one to
# five bytes (0 and a non-minimal one included), each other property type, an identifier
# MQTT 5 does not define for a PUBLISH, a string running past the block.
property_pieces = st.lists(
    st.sampled_from(
        [
            b"\x0b\x05",
            b"\x0b\x81\x01",
            b"\x0b\xff\xff\xff\x7f",
            b"\x0b\x80\x80\x80\x80\x01",
            b"\x0b\x80\x80\x80\x00",
            b"\x0b\xb9\xb4\xac\x6c",
            b"\x0b\xb9\xb4\xac\xec",
            b"\x0b\x00",
            b"\x0b\x85\x00",
            b"\x01\x01",
            b"\x02\x00\x00\x00\x3c",
            b"\x23\x00\x01",
            b"\x03\x00\x02js",
            b"\x08\x00\x01r",
            b"\x09\x00\x00",
            b"\x26\x00\x01k\x00\x02vv",
            b"\x26\x00\x01k",
            b"\x03\x00\x09",
            b"\x0b",
            b"\x17\x01",
        ]
    ),
    max_size=6,
).map(b"".join)


@st.composite
def publishes(draw: st.DrawFn, large: bool = True) -> bytes:
    """A PUBLISH as a broker may send it, or nearly: any QoS (2 and the invalid 3
    included), DUP and RETAIN, a topic that need not be UTF-8, properties with a length
    in one or more bytes, non-minimal remaining lengths, payloads up to a 3-byte
    remaining length if ``large``."""
    qos = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
    topic = draw(st.one_of(st.text(max_size=20).map(str.encode), st.binary(max_size=20)))
    props = draw(
        st.one_of(
            st.just(b""),
            st.binary(max_size=3),
            st.binary(min_size=128, max_size=300),
            property_pieces,
        )
    )
    props_length = remaining_length(len(props), draw(st.integers(0, 2)))
    payload = draw(
        st.one_of(
            st.binary(max_size=40),
            st.integers(100, 20000 if large else 300).map(lambda n: b"p" * n),
        )
    )
    body = (
        len(topic).to_bytes(2)
        + topic
        + (draw(st.integers(0, 0xFFFF)).to_bytes(2) if qos else b"")
        + props_length
        + props
        + payload
    )
    flags = qos << 1 | draw(st.sampled_from([0, 0x08])) | draw(st.sampled_from([0, 0x01]))
    extra = draw(st.integers(0, 4 - len(varint(len(body)))))
    return bytes((0x30 | flags,)) + remaining_length(len(body), extra) + body


@st.composite
def malformed(draw: st.DrawFn) -> bytes:
    """A PUBLISH whose body is arbitrary: a topic or property length past its end, a
    property length in many bytes; or a remaining length over 4 bytes."""
    if draw(st.booleans()):
        return bytes((0x30 | draw(st.integers(0, 15)), 0xFF, 0xFF, 0xFF, 0xFF, 0x01))
    body = draw(
        st.one_of(
            st.binary(max_size=12),
            st.tuples(
                st.binary(min_size=3, max_size=3),
                st.binary(max_size=8).map(lambda tail: b"\x80" * len(tail) + tail),
            ).map(
                lambda parts: (
                    b"\x00\x01t" + parts[1] if parts[0][0] & 1 else b"\x00\x01t\x00\x01" + parts[1]
                )
            ),
        )
    )
    return bytes((draw(st.sampled_from([0x30, 0x32, 0x3B])),)) + varint(len(body)) + body


others = st.sampled_from(
    [
        b"\xd0\x00",
        b"\x62\x02\x00\x01",
        b"\x90\x04\x00\x01\x00\x01",
        b"\x40\x02\x00\x07",
        b"\x30",
        b"\x32\x85",
    ]
)
buffers = st.lists(
    st.one_of(publishes(), publishes(), publishes(), malformed(), others, st.binary(max_size=6)),
    max_size=8,
).map(b"".join)


class Reader:
    """What the scanners read and move: a position and a pause flag."""

    def __init__(self, pos: object, paused: bool = False) -> None:
        self._pos = pos
        self._paused = paused


type Outcome = tuple[object, object, list[tuple[tuple[type, object], ...]]]


def run(
    scan: Callable[..., int],
    data: object,
    pos: object,
    pause_after: int | None = None,
    fail_after: int | None = None,
    paused: bool = False,
) -> Outcome:
    """What a scanner does to ``data``: its result or exception, the position it left,
    each delivery's arguments with their types. The delivery pauses the reader after
    ``pause_after`` packets and raises at packet ``fail_after``."""
    reader = Reader(pos, paused)
    delivered: list[tuple[tuple[type, object], ...]] = []

    def deliver(*args: object) -> None:
        delivered.append(tuple((type(arg), arg) for arg in args))
        if len(delivered) == fail_after:
            raise RuntimeError("the delivery failed")
        if len(delivered) == pause_after:
            reader._paused = True

    try:
        result: object = scan(data, reader, deliver)
    except Exception as exc:  # noqa: BLE001 - the outcome compared
        result = (type(exc), str(exc))
    return result, reader._pos, delivered


def same(data: bytes, pos: int = 0, **how: Any) -> Outcome:
    python = run(_wire_py.scan, data, pos, **how)
    assert run(twin.scan, data, pos, **how) == python
    return python


@given(
    buffers,
    st.integers(0, 2),
    st.none() | st.integers(1, 4),
    st.none() | st.integers(1, 4),
    st.booleans(),
)
def test_both_scanners_deliver_the_same_packets_and_stop_at_the_same_byte(
    data: bytes, pos: int, pause_after: int | None, fail_after: int | None, paused: bool
) -> None:
    same(data, pos, pause_after=pause_after, fail_after=fail_after, paused=paused)


@given(
    st.lists(st.one_of(publishes(large=False), malformed(), others), min_size=1, max_size=3).map(
        b"".join
    )
)
def test_both_scanners_agree_on_a_buffer_cut_at_every_byte(data: bytes) -> None:
    for cut in range(len(data) + 1):
        for pos in (0, 1, cut):
            same(data[:cut], pos)


@given(
    st.lists(st.one_of(publishes(large=False), malformed(), others), min_size=1, max_size=3).map(
        b"".join
    ),
    st.sampled_from([1, 10, 65536]),
)
def test_a_publish_cut_at_the_end_is_told_apart_alike_by_both_twins(
    data: bytes, limit: int
) -> None:
    """At every cut and position: a QoS 0/1 PUBLISH that goes on past the buffer's end
    (its remaining length at most ``limit``, or not all there) is told from anything
    else the same way by both twins; a complete one is no cut PUBLISH."""
    for cut in range(len(data) + 1):
        for pos in (0, 1, cut):
            found = _wire_py.cut_publish(data[:cut], pos, limit)
            assert twin.cut_publish(data[:cut], pos, limit) is found
            if found:  # the scan stops there: its packet is not complete
                assert same(data[:cut], pos)[0] == 0


@st.composite
def properties(draw: st.DrawFn) -> tuple[bytes, object]:
    """A PUBLISH's properties as paho encodes them (without their length), and the
    Subscription Identifiers the parsers must find in them: 0, one, or a tuple."""
    props = Properties(PacketTypes.PUBLISH)
    if draw(st.booleans()):
        props.PayloadFormatIndicator = draw(st.integers(0, 1))
    if draw(st.booleans()):
        props.MessageExpiryInterval = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        props.ContentType = draw(st.text(max_size=20))
    if draw(st.booleans()):
        props.CorrelationData = draw(st.binary(max_size=20))
    for pair in draw(st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=2)):
        props.UserProperty = pair
    identifiers = draw(st.lists(st.integers(1, 268_435_455), max_size=3))
    for value in identifiers:
        props.SubscriptionIdentifier = value
    packed = props.pack()
    length = 1 + next(i for i, byte in enumerate(packed) if not byte & 0x80)
    found: object = (
        tuple(identifiers) if len(identifiers) > 1 else identifiers[0] if identifiers else 0
    )
    return packed[length:], found


@given(
    st.lists(
        st.tuples(
            st.text(max_size=30),
            st.binary(max_size=300),
            st.integers(1, 0xFFFF),
            st.integers(0, 1),
            st.booleans(),
            st.booleans(),
            properties(),
        ),
        max_size=10,
    )
)
def test_the_scanner_delivers_what_was_encoded(
    messages: list[tuple[str, bytes, int, int, bool, bool, tuple[bytes, object]]],
) -> None:
    data = b"".join(
        publish_packet(topic, payload, mid, qos, dup, props[0], retain)
        for topic, payload, mid, qos, dup, retain, props in messages
    )
    handled, pos, delivered = same(data + b"\x30", pause_after=None)
    assert (handled, pos) == (len(messages), len(data))
    assert [tuple(value for _type, value in args) for args in delivered] == [
        (topic, payload, mid if qos else 0, qos, dup, retain, props[1])
        for topic, payload, mid, qos, dup, retain, props in messages
    ]
    assert all(
        types[:6] == (str, bytes, int, int, bool, bool) and types[6] in (int, tuple)
        for types in (tuple(t for t, _v in args) for args in delivered)
    )


@pytest.mark.parametrize(
    ("props", "found"),
    [
        (b"", 0),
        (b"\x0b\x05", 5),
        (b"\x0b\xff\xff\xff\x7f", 268_435_455),
        (b"\x0b\x80\x80\x80\x00", 0),  # 0, non-minimal
        (b"\x0b\x80\x80\x80\x80", 0),  # a fifth byte would follow: not read
        (b"\x01\x01\x0b\x81\x01\x0b\x07", (129, 7)),
        (b"\x0b\x00", 0),  # 0 is no identifier
        (b"\x0b\x80\x80\x80\x80\x01", 0),  # over 4 bytes: not read
        (b"\x0b\x05\x17\x01\x0b\x06", 5),  # an unknown property ends the reading
        (b"\x0b\x05\x03\x00\x09\x0b\x06", 5),  # so does a string past the block
    ],
)
def test_both_parsers_find_the_subscription_identifiers(props: bytes, found: object) -> None:
    _result, _pos, delivered = same(publish_packet("t", b"p", 3, 1, props=props))
    assert delivered[0][6] == (type(found), found)


def test_a_header_past_its_packet_raises_after_moving_past_it_in_both_scanners() -> None:
    good = publish_packet("t", b"next", 9, 1)
    bad = bytearray(publish_packet("t", b"", 8, 1))
    bad[2:4] = (200).to_bytes(2)  # topic length 200 in a 7-byte body
    result, pos, delivered = same(good + bad + good)
    assert result == (ValueError, "malformed PUBLISH: its header runs past its end")
    assert (pos, len(delivered)) == (len(good + bad), 1)


def test_a_non_utf8_topic_is_decoded_with_replacement_by_both_scanners() -> None:
    body = b"\x00\x03a\xffb" + b"\x00" + b"payload"
    _result, _pos, delivered = same(b"\x30" + varint(len(body)) + body)
    assert delivered[0][0] == (str, "a\ufffdb")


@pytest.mark.parametrize(
    ("data", "pos", "error"),
    [
        (bytearray(b"\x30\x00"), 0, (TypeError, "a read buffer is bytes, not bytearray")),
        (b"\x30\x00", -1, (ValueError, "position -1 before the buffer")),
        (b"\x30\x00", 2**70, 0),
        (b"\x30\x00", 1.0, (TypeError, "'float' object cannot be interpreted as an integer")),
    ],
)
def test_a_buffer_or_position_out_of_range_is_refused_alike(
    data: object, pos: float, error: object
) -> None:
    assert run(twin.scan, data, pos) == run(_wire_py.scan, data, pos) == (error, pos, [])


@given(
    st.integers(0, 0xFF) | st.integers(-5, 300) | st.just(2**70),
    st.binary(max_size=30),
    st.integers(-3, 35) | st.sampled_from([2**63, 2**70, -(2**70)]),
    st.integers(-3, 35) | st.sampled_from([2**63, 2**70, -(2**70)]),
)
def test_both_publish_parsers_agree_on_any_body_bounds(
    command: int, data: bytes, at: int, stop: int
) -> None:
    def outcome(deliver_publish: Callable[..., None]) -> object:
        delivered: list[tuple[object, ...]] = []
        try:
            deliver_publish(lambda *args: delivered.append(args), command, data, at, stop)
        except Exception as exc:  # noqa: BLE001 - the outcome compared
            return type(exc), str(exc)
        return delivered

    assert outcome(twin.deliver_publish) == outcome(_wire_py.deliver_publish)


def test_a_property_length_over_four_bytes_is_malformed_in_both_scanners() -> None:
    """MQTT's variable byte integers have at most 4 bytes: a fifth is a malformed packet."""
    good = publish_packet("t", b"next", 9, 1)
    body = b"\x00\x01t" + b"\x80\x80\x80\x80\x00" + b"payload"
    bad = b"\x30" + varint(len(body)) + body
    result, pos, delivered = same(good + bad + good)
    assert result == (ValueError, "malformed PUBLISH: its header runs past its end")
    assert (pos, len(delivered)) == (len(good + bad), 1)
