"""Size-or-linger batching and the pipeline's intake, as the package names them.

Written once, in ``_batcher_py.py``, which Cython compiles as ``_batcher_c`` (see
ingest/accel.py): each name here is the one :func:`ingest.accel.pick` chose.
"""

from __future__ import annotations

from ingest import accel
from ingest.pipeline import _batcher_py
from ingest.pipeline._batcher_py import MESSAGE_BYTES as MESSAGE_BYTES  # noqa: PLC0414
from ingest.pipeline._batcher_py import NO_DOCS as NO_DOCS  # noqa: PLC0414
from ingest.pipeline._batcher_py import READING_BYTES as READING_BYTES  # noqa: PLC0414
from ingest.pipeline._batcher_py import REJECT_DOC_BYTES as REJECT_DOC_BYTES  # noqa: PLC0414
from ingest.pipeline._batcher_py import VALUE_BYTES as VALUE_BYTES  # noqa: PLC0414
from ingest.pipeline._batcher_py import IntakeSteps as IntakeSteps  # noqa: PLC0414

Batch = accel.pick(_batcher_py.Batch, "ingest.pipeline._batcher_c", "Batch")
Batcher = accel.pick(_batcher_py.Batcher, "ingest.pipeline._batcher_c", "Batcher")
Intake = accel.pick(_batcher_py.Intake, "ingest.pipeline._batcher_c", "Intake")
held_bytes = accel.pick(_batcher_py.held_bytes, "ingest.pipeline._batcher_c", "held_bytes")
merged = accel.pick(_batcher_py.merged, "ingest.pipeline._batcher_c", "merged")
