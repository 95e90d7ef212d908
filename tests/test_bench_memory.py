"""The memory benchmark: a tiny run past a small cache bound accounts for every reading
and reports the caches at their bound; the per-entry sizes come from real caches."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from bench import memory
from ingest import caches
from ingest.devices import _decode_py, decode

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.process
def test_a_fleet_past_the_bound_is_measured_and_every_reading_reaches_the_sink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "memory.json"
    argv = ["--modes", "timeseries", "--warm-sensors", "300", "--warmup", "600"]
    argv += ["--fleet", "1000,2000", "--daemon-arg=--max-cached-series=800", "--json", str(out)]
    assert memory.main(argv) == 0
    [result] = json.loads(out.read_text())
    assert result["messages"] == result["written"] == result["at_sink"] == 600 + 1700
    assert [step["sensors"] for step in result["steps"]] == [300, 1000, 2000]
    last = result["steps"][-1]
    # the pure-Python decoder's checked ids (compiled: checked in C, none held)
    assert last["gauges"]["sensor_ids"] == (800 if decode.decode is _decode_py.decode else 0)
    assert 0 < last["gauges"]["topic_checksums"] <= 800
    assert all(step["rss_bytes"] > 10 * 2**20 for step in result["steps"])
    assert "| 2,000 |" in capsys.readouterr().out


def test_each_cache_is_measured_per_entry_and_the_bound_restored() -> None:
    before = caches.limit
    sizes = memory.structures(2000)
    assert set(sizes) == {
        "sensor_ids",
        "arrival_times",
        "topic_checksums",
        "mapped_topics",
        "sparkplug_metrics",
        "homie_properties",
    }
    assert all(40 < size < 2000 for size in sizes.values()), sizes  # a key and its entry
    assert caches.limit == before
