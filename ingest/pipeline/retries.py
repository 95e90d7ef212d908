"""One MongoDB call of the pipeline's, retried like a write until it is answered.

The delivery ledger's record and read (ingest/pipeline/redelivered.py) and a retained
state's first-seen time (ingest/pipeline/retained.py) wait for MongoDB as a batch's write
does: a transient failure goes through the pipeline's own wait after a failed write
(backoff, ``/readyz``, the error metric) and is tried again; a refusal for the data
(:class:`~ingest.errors.RefusedWriteError`) is the caller's to handle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingest.errors import RefusedWriteError, WriteError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ingest.metrics import Health

type Failed = Callable[[WriteError, int], Awaitable[None]]


def _never() -> bool:
    return False


async def until_answered[T](
    call: Callable[[], Awaitable[T]],
    failed: Failed,
    health: Health,
    closed: Callable[[], bool] = _never,
) -> T | None:
    """``call``'s answer, retried after each ``failed(error, attempt)``.

    None if ``closed()`` first; :class:`~ingest.errors.RefusedWriteError` is raised as it
    comes.
    """
    attempt = 0
    while not closed():
        try:
            answer = await call()
        except RefusedWriteError:
            raise
        except WriteError as exc:
            attempt += 1
            await failed(exc, attempt)
            continue
        if attempt:
            health.mongodb_ok = True
        return answer
    return None
