"""MongoDB's error codes and labels, and the one place the daemon reads them.

Every driver exception on the write path goes through :func:`translate` (a whole command
failed) or :func:`per_operation` (one operation of a bulk write failed), so the same error
means the same thing everywhere: retried with backoff, refused for its data, or "the
schema is gone". The codes come from the server's ``src/mongo/base/error_codes.yml``;
docs/mongodb-errors.md lists them with what the daemon does.

The rule: refuse only what is known to be the data's fault, for the operation at hand,
and retry everything else (unknown codes included). A refused reading is acknowledged
and kept in the rejects collection; a retried one is never acknowledged until written,
so a wrong "retry" costs a stall that the logs and ``/readyz`` show, and a wrong
"refuse" would cost data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from bson.errors import InvalidDocument
from pymongo.errors import OperationFailure
from pymongo.errors import WriteError as OneOperationFailed

from ingest.errors import RefusedWriteError, SchemaGoneError, WriteError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pymongo.errors import PyMongoError

# What a MongoDB call on the write path is for; the refusals depend on it.
type Call = Literal["write", "lookup", "rejects"]
type Verdict = Literal["retry", "refuse", "schema", "duplicate"]

# E11000: the write would store a key a unique index already holds. In bucket mode the
# unique (sensor_id, readings.ts) index raises it for a reading that is already stored.
DUPLICATE_KEY = 11000
BAD_VALUE = 2
INDEX_OPTIONS_CONFLICT = 85
INDEX_KEY_SPECS_CONFLICT = 86

# Codes that refuse a write for the data it carries: sending the same operation again
# gets the same answer. Only these send a reading to ``rejects``.
DATA_CODES: Mapping[int, str] = {
    2: "BadValue",
    9: "FailedToParse",
    14: "TypeMismatch",
    15: "Overflow",
    28: "PathNotViable",
    40: "ConflictingUpdateOperators",
    52: "DollarPrefixedFieldName",
    55: "InvalidDBRef",
    56: "EmptyFieldName",
    57: "DottedFieldName",
    66: "ImmutableField",
    121: "DocumentValidationFailure",
    10334: "BSONObjectTooLarge",
    17419: "document too large after the update (assertion 17419)",
}
# Of those, the ones that refuse a whole command for its data. A command fails as a whole
# for what it is (an option, its parsing, its size): a BadValue or FailedToParse there
# says nothing about a reading, so it is retried, and the problems of one document are
# reported per operation (``writeErrors``) instead.
COMMAND_DATA_CODES = frozenset({121, 10334, 17419})
# Codes the server documents as transient, by category (RetriableError, NetworkError,
# Interruption, ShutdownError, NotPrimaryError, StaleShardVersionError, ...) or by what
# it asks of the client (82, 409). Listed for the docs and the logs: every code not in
# DATA_CODES is retried anyway.
TRANSIENT_CODES: Mapping[int, str] = {
    6: "HostUnreachable",
    7: "HostNotFound",
    24: "LockTimeout",
    46: "LockBusy",
    50: "MaxTimeMSExpired",
    64: "WriteConcernTimeout",
    82: "NoProgressMade",
    89: "NetworkTimeout",
    91: "ShutdownInProgress",
    112: "WriteConflict",
    134: "ReadConcernMajorityNotAvailableYet",
    150: "StaleEpoch",
    189: "PrimarySteppedDown",
    249: "StaleDbVersion",
    262: "ExceededTimeLimit",
    279: "ClientDisconnect",
    365: "TemporarilyUnavailable",
    402: "ResourceExhausted",
    409: "TimeseriesBucketCompressionFailed",
    412: "UpdatesStillPending",
    433: "AdmissionQueueOverflow",
    449: "RateLimitExceeded",
    453: "InterruptedDueToReshardingCriticalSection",
    462: "IngressRequestRateLimitExceeded",
    9001: "SocketException",
    10058: "LegacyNotPrimary",
    10107: "NotWritablePrimary",
    11600: "InterruptedAtShutdown",
    11601: "Interrupted",
    11602: "InterruptedDueToReplStateChange",
    13388: "StaleConfig",
    13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary",
    91331: "RetriableRemoteCommandFailure",
    10045600: "InterruptedDueToFCVChange",
}
# Labels with which the server or the driver marks an error as safe to retry.
RETRY_LABELS = frozenset(
    {"RetryableWriteError", "TransientTransactionError", "SystemOverloadedError", "RetryableError"}
)
# BadValue with this message: a ``hint`` names an index that does not exist (the server
# says "hint provided does not correspond to an existing index",
# src/mongo/db/query/query_planner.cpp). The schema is gone, not the data.
HINT_MISSING = "does not correspond to an existing index"


def _code_name(code: int | None) -> str:
    if code is None:
        return ""
    name = DATA_CODES.get(code) or TRANSIENT_CODES.get(code)
    return f" (code {code} {name})" if name else f" (code {code})"


def hint_missing(code: object, message: str) -> bool:
    """Whether an error says that the hinted index does not exist."""
    return code == BAD_VALUE and HINT_MISSING in message


def translate(exc: PyMongoError | InvalidDocument, call: Call) -> WriteError:
    """One whole command failed: the error the pipeline acts on (by its class).

    - a document the driver cannot encode, or a write refused for its data as a whole,
      becomes :class:`RefusedWriteError` (the pipeline splits the request to isolate
      the readings at fault); a lookup is never refused for its data;
    - a hinted index that does not exist becomes :class:`SchemaGoneError`;
    - everything else (network, elections, interruptions, timeouts, missing privileges,
      unknown codes) is a retriable :class:`WriteError`.
    """
    code = _code(exc)
    message = f"{type(exc).__name__}: {str(exc)[:300]}{_code_name(code)}"
    labels = _labels(exc)
    if hint_missing(code, str(exc)):
        return SchemaGoneError(message)
    # pymongo raises WriteError for the one operation of a single write (update_one,
    # insert_one) the server refused in ``writeErrors``: judged as an operation.
    refusing = DATA_CODES if isinstance(exc, OneOperationFailed) else COMMAND_DATA_CODES
    if (
        call != "lookup"
        and not labels & RETRY_LABELS
        and (isinstance(exc, InvalidDocument) or code in refusing)
    ):
        return RefusedWriteError(message)
    return WriteError(message)


def per_operation(error: Mapping[str, object], call: Call, collide: bool = False) -> Verdict:
    """What to do with one failed operation of a bulk write (a ``writeErrors`` entry)."""
    code = error.get("code")
    if collide and code == DUPLICATE_KEY:
        return "duplicate"
    if hint_missing(code, str(error.get("errmsg", ""))):
        return "schema"
    if call != "lookup" and (code in DATA_CODES or code == DUPLICATE_KEY):
        return "refuse"
    return "retry"


def describe(error: Mapping[str, object]) -> str:
    """A one-line detail for one failed operation, as stored in ``rejects``."""
    return f"code {error.get('code')}: {str(error.get('errmsg', ''))[:200]}"


def _code(exc: PyMongoError | InvalidDocument) -> int | None:
    """The server's code, also of the errors pymongo raises as connection failures.

    (NotPrimaryError, for 91, 189, 10107, 11600, 11602, 13435 and 13436.)
    """
    if isinstance(exc, OperationFailure):
        return exc.code
    details = getattr(exc, "details", None)
    code = details.get("code") if isinstance(details, dict) else None
    return code if isinstance(code, int) else None


def _labels(exc: PyMongoError | InvalidDocument) -> set[str]:
    labels = getattr(exc, "_error_labels", None)
    return set(labels) if labels else set()
