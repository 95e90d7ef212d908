"""Sensor fleet simulator, delivery check and bucket-vs-time-series benchmark.

``loadgen publish`` (cli, config, publisher, worker, wire, ratelimit, payloads,
sparkplug) publishes a deterministic fleet; ``loadgen verify`` (verify) checks that each
reading arrived exactly once; ``loadgen bench`` (bench, bench_cli, daemons, latency,
measure, report) runs both storage modes side by side; ``loadgen bucket-fill``
(bucket_fill) measures a bucket write as its document fills.
"""

import sys

# As in ``ingest``: one line on an older Python, not a SyntaxError.
if sys.version_info < (3, 13):  # noqa: UP036 - the point is to run on older ones
    raise SystemExit(
        f"loadgen: error: iot-ingest needs Python 3.13 or newer; {sys.executable} is "
        f"{sys.version_info[0]}.{sys.version_info[1]}: install Python 3.13 and reinstall "
        "with it (python3.13 -m pip install ...)"
    )
