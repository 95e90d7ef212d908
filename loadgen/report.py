"""Pure: the bench report as Markdown (modes as columns), JSON and an optional PNG chart."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

QUERIES = (
    ("one_sensor_last_hour", "query: one sensor, last hour (median ms)"),
    ("one_sensor_last_24h", "query: one sensor, last 24 h (median ms)"),
    ("hourly_all_sensors_day", ("query: hourly min/avg/max, all sensors, 1 day (median ms)")),
    ("promql_avg_over_time_day", "query: PromQL avg_over_time(temp[1h]), 1 day at 1 h (median ms)"),
)
SECTIONS = (
    "published",
    "written",
    "throughput",
    "latency_ms",
    "writes",
    "storage",
    "queries_ms",
    "verify",
)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0..100) with linear interpolation between ranks; None if empty."""
    if not values:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _num(value: object, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _bytes(value: object) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "n/a"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} GiB"  # pragma: no cover - the loop always returns


def _latency(m: dict[str, Any]) -> str:
    lat = m.get("latency_ms") or {}
    if not lat.get("seen"):
        return "n/a"
    return (
        f"{_num(lat.get('p50'))} / {_num(lat.get('p90'))} / {_num(lat.get('p99'))} "
        f"({lat['seen']}/{lat.get('samples')} sampled)"
    )


def _verify(m: dict[str, Any]) -> str:
    v = m.get("verify") or {}
    if not v:
        return "n/a"
    if v.get("ok"):
        return f"OK ({v.get('found', 0):,} readings)"
    return (
        f"MISMATCH: missing {v.get('missing')}, duplicated {v.get('duplicated')}, "
        f"wrong {v.get('wrong')}, bad documents {v.get('bad_documents')}"
    )


def _get(*path: str, fmt: Callable[[object], str] = _num) -> Callable[[dict[str, Any]], str]:
    def read(m: dict[str, Any]) -> str:
        value: Any = m
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return fmt(value)

    return read


def _rows() -> list[tuple[str, Callable[[dict[str, Any]], str]]]:
    two = lambda v: _num(v, 2)  # noqa: E731
    return [
        ("readings published", _get("published")),
        (
            "readings written (rejected)",
            lambda m: f"{_num(m.get('written'))} ({_num(m.get('rejected'))})",
        ),
        (
            "ingest throughput (readings/s, first publish to last write)",
            _get("throughput", "readings_per_s"),
        ),
        ("end-to-end latency p50 / p90 / p99 (ms)", _latency),
        (
            "MongoDB write ops / reading",
            _get("writes", "ops_per_reading", fmt=lambda v: _num(v, 3)),
        ),
        (
            "MongoDB write requests / reading",
            _get("writes", "requests_per_reading", fmt=lambda v: _num(v, 4)),
        ),
        (
            "bytes sent / reading (estimate, BSON of the operations)",
            _get("writes", "est_bytes_per_reading", fmt=lambda v: _num(v, 1)),
        ),
        ("documents stored", _get("storage", "documents")),
        ("storageSize", _get("storage", "storage_size", fmt=_bytes)),
        ("totalIndexSize", _get("storage", "total_index_size", fmt=_bytes)),
        ("average document size", _get("storage", "avg_document_size", fmt=_bytes)),
        *[(label, _get("queries_ms", key, "median_ms", fmt=two)) for key, label in QUERIES],
        ("loadgen verify", _verify),
    ]


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a heading, what ran where, and one table with modes as columns."""
    modes = report.get("modes") or {}
    names = list(modes)
    server = report.get("server") or {}
    w = report.get("workload") or {}
    lines = [
        f"# loadgen bench {report.get('run_id', '')}",
        "",
        (
            f"- started: {report.get('started_at', 'n/a')}, finished: "
            f"{report.get('finished_at', 'n/a')}"
        ),
        f"- server: MongoDB {server.get('version', 'n/a')} ({server.get('label', 'n/a')})",
        (
            f"- workload: preset `{w.get('preset')}`, {_num(w.get('sensors'))} sensors, "
            f"{_num(w.get('count'))} readings, {w.get('per_message')} per message, "
            f"rate {_num(w.get('rate'))}/s, QoS {w.get('qos')}, start {w.get('start')}, "
            f"time step {w.get('time_step_s')} s, late every {w.get('late_every')}, "
            f"{'running daemons' if w.get('use_running') else 'daemons started by bench'}"
        ),
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label, read in _rows():
        lines.append(f"| {label} | " + " | ".join(read(modes[n]) for n in names) + " |")
    notes = report.get("notes") or []
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def render_json(report: dict[str, Any]) -> str:
    """The report as indented JSON."""
    return json.dumps(report, indent=2, sort_keys=False, default=str) + "\n"


CHART_PANELS = (
    ("ingest readings/s", ("throughput", "readings_per_s")),
    ("latency p50 (ms)", ("latency_ms", "p50")),
    ("bytes sent / reading (est.)", ("writes", "est_bytes_per_reading")),
    ("storageSize (KiB)", ("storage", "storage_size")),
    ("last hour query (ms)", ("queries_ms", "one_sensor_last_hour", "median_ms")),
    ("hourly all sensors (ms)", ("queries_ms", "hourly_all_sensors_day", "median_ms")),
)


def _value(mode: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = mode
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, (int, float)):
        return 0.0
    return float(value) / 1024 if path == ("storage", "storage_size") else float(value)


def write_chart(report: dict[str, Any], path: Path) -> str | None:
    """Draw the report as a PNG; the reason it was skipped, or None when written."""
    try:
        import matplotlib as mpl  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - an optional extra

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        return (
            "matplotlib is not installed (pip install 'iot-ingest[bench]'; from a clone: "
            "pip install -e '.[bench]')"
        )
    modes = report.get("modes") or {}
    names = list(modes)
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (title, key) in zip(axes.flat, CHART_PANELS, strict=True):
        ax.bar(names, [_value(modes[n], key) for n in names], color=["#4c72b0", "#dd8452"])
        ax.set_title(title, fontsize=10)
    server = (report.get("server") or {}).get("label", "")
    fig.suptitle(f"loadgen bench {report.get('run_id', '')} ({server})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
