"""The MQTT bytes of the hot path: the Python functions and their compiled twins agree."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.mqtt import wire
from tests.support.twins import compiled

twin = compiled("ingest.mqtt._wire_c")


@given(st.lists(st.integers(min_value=1, max_value=0xFFFF), max_size=300))
def test_pubacks_are_four_bytes_each_in_order_in_both_twins(mids: list[int]) -> None:
    expected = b"".join(struct.pack(">BBH", 0x40, 2, mid) for mid in mids)
    assert wire.pubacks_py(mids) == expected
    assert twin.pubacks(mids) == expected


@pytest.mark.parametrize("mid", [0, -1, 0x10000, 2**70])
def test_a_packet_id_outside_the_range_is_refused_by_both_twins(mid: int) -> None:
    for pubacks in (wire.pubacks_py, twin.pubacks):
        with pytest.raises(ValueError, match=f"packet id {mid} outside 1..65535"):
            pubacks([1, mid])
