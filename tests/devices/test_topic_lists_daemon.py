"""Rules that list several topic filters, end to end in both modes.

WLED's housekeeping (``<device>/api``, ``<device>/status``, the group topic ``all``) in
one ignore rule before its readings, and one value rule over two trees, published to a
real broker and read by the real daemon subscribed to the rules' filters: every filter
subscribed, the ignored messages counted under the one rule's label, the readings of
both trees stored in MongoDB over the wire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.devices.test_rule_language_daemon import _stored
from tests.support.mongo import COLLECTION
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Daemon

MAPPING = """
[[rule]]
name = "wled-housekeeping"
topic = ["{root}/wled/+/api", "{root}/wled/+/status", "{root}/wled/all"]
ignore = true

[[rule]]
name = "wled"
topic = "{root}/wled/{{sensor_id}}/{{measurement}}"
format = "value"

[[rule]]
name = "meters"
topic = [
  "{root}/meters/{{sensor_id}}/{{measurement}}",
  "{root}/legacy/{{measurement}}/{{sensor_id}}",
]
format = "value"
"""


async def test_a_rule_of_several_filters_subscribes_to_each_and_counts_under_one_name(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    mapping = tmp_path / "mapping.toml"
    mapping.write_text(MAPPING.format(root=topic_root))
    proc = daemon("--mapping", str(mapping), rule_topics=True)
    wled = f"{topic_root}/wled"
    messages: list[tuple[str, bytes]] = [
        (f"{wled}/kitchen/api", b"FX=2&SX=200"),
        (f"{wled}/kitchen/status", b"online"),
        (f"{wled}/porch/status", b"offline"),
        (f"{wled}/all", b"T"),
        (f"{wled}/kitchen/g", b"128"),
        (f"{topic_root}/meters/m1/power", b"412.5"),
        (f"{topic_root}/legacy/power/m7", b"99.5"),
        (f"{topic_root}/other/power/m8", b"1"),  # no rule's filter: never subscribed
    ]
    await publish(messages)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(messages) - 1)
    await eventually(lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 3)
    assert proc.metric('ingest_messages_ignored_total{rule="wled-housekeeping"}') == 4
    assert proc.metric('ingest_messages_ignored_total{rule="(outside the rules)"}') == 0
    assert proc.metric('ingest_rule_messages_total{outcome="accepted",rule="meters"}') == 2
    subscribed = (
        f"subscribed to {wled}/all, {wled}/+/+, {topic_root}/meters/+/+, {topic_root}/legacy/+/+"
    )
    assert subscribed in proc.logs()  # wled/+/+ covers wled/+/api and wled/+/status
    stored = await _stored(db[COLLECTION[mode]], mode)
    assert sorted((s, v) for (s, _), (v, _) in stored.items()) == [
        ("kitchen", {"g": 128}),
        ("m1", {"power": 412.5}),
        ("m7", {"power": 99.5}),
    ]
    assert proc.stop() == 0
