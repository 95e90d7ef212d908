"""A short exception hierarchy; retries are decided by the ``retriable`` flag."""


class IngestError(Exception):
    """Base of every error the daemon raises on purpose."""

    retriable = False


class ConfigError(IngestError):
    """Invalid settings; the message is one line naming the flag."""


class SchemaError(IngestError):
    """The target collection exists with a shape we must not write into."""


class WriteError(IngestError):
    """A write to MongoDB failed as a whole and may be retried."""

    retriable = True


class FatalWriteError(IngestError):
    """A write failed in a way retrying cannot fix (auth, bad namespace...)."""
