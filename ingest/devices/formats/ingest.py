"""``ingest``: the daemon's own format, decoded by :func:`ingest.devices.decode.decode`.

Without mapping rules the pipeline calls that decoder directly (no rule lookup); a rule
with ``format = "ingest"`` calls it with the sensor id its topic captures.
"""

from __future__ import annotations

from ingest.devices.decode import Limits, decode

__all__ = ["Limits", "decode"]
