"""Writing a stateful format's state: one MongoDB step, retried until it succeeds.

Sparkplug's alias tables and Homie's device attributes are kept in memory and backed by
MongoDB (ingest/devices/sparkplug_state.py, ingest/devices/homie_state.py); each write or
read of that state goes through :func:`until_done`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bson.errors import InvalidDocument
from pymongo.errors import PyMongoError

from ingest.errors import RefusedWriteError
from ingest.retry import backoff
from ingest.store.writers import as_write_error

if TYPE_CHECKING:
    import logging
    from collections.abc import Awaitable, Callable


async def until_done(
    step: Callable[[], Awaitable[None]],
    what: str,
    closing: Callable[[], bool],
    log: logging.Logger,
    who: str,
) -> bool:
    """Run a stateful format's MongoDB ``step`` until it succeeds; False if closing first.

    Transient MongoDB errors are retried with backoff. A refusal for the data itself
    (document too large, validation) is logged and given up: the state is still used from
    memory, and retrying would block the daemon for good. ``who`` starts each log line.
    """
    attempt = 0
    while not closing():
        try:
            await step()
        except (PyMongoError, InvalidDocument) as exc:
            error = as_write_error(exc)
            if isinstance(error, RefusedWriteError):
                # An expected server answer, not a bug: no traceback.
                log.error(  # noqa: TRY400
                    "%s: MongoDB refused to %s (kept in memory only): %s",
                    who,
                    what,
                    error,
                )
                return True
            attempt += 1
            delay = backoff(attempt)
            log.warning(
                "%s: cannot %s (attempt %d, retrying in %.2fs): %s",
                who,
                what,
                attempt,
                delay,
                str(exc)[:200],
            )
            await asyncio.sleep(delay)
        else:
            return True
    return False
