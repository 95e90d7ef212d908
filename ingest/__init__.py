"""MQTT to MongoDB time-series ingestion daemon."""

import sys

__version__ = "0.1.0"

# Checked before any module written in 3.13 syntax is imported: an older Python gets one
# line (exit status 1) instead of a SyntaxError from deep inside the package.
if sys.version_info < (3, 13):  # noqa: UP036 - the point is to run on older ones
    raise SystemExit(
        f"ingest: error: iot-ingest needs Python 3.13 or newer; {sys.executable} is "
        f"{sys.version_info[0]}.{sys.version_info[1]}: install Python 3.13 and reinstall "
        "with it (python3.13 -m pip install ...)"
    )
