"""A stand-in for the MQTT source's acknowledgements, for pipeline tests without a broker."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ingest.model import Inbound


class Acks:
    """Records the packet ids the pipeline acknowledges, in order."""

    def __init__(self) -> None:
        self.mids: list[int] = []

    def ack_all(self, messages: list[Inbound]) -> int:
        """Acknowledge ``messages``: remember their packet ids."""
        self.mids += [message.mid for message in messages]
        return len(messages)

    def holds(self, _message: Inbound) -> bool:
        """Every message offered is still held (no connection ends here)."""
        return True
