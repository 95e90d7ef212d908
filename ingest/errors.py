"""A short exception hierarchy; retries are decided by the ``retriable`` flag."""


class IngestError(Exception):
    """Base of every error the daemon raises on purpose."""

    retriable = False


class ConfigError(IngestError):
    """Invalid settings; the message is one line naming the flag."""


class StartupError(IngestError):
    """The environment stops the daemon from starting (a port in use, a refusing broker).

    The message is one line naming the address or flag and what to do.
    """


class SchemaError(IngestError):
    """The target collection exists with a shape we must not write into."""


class IncompatibleError(IngestError):
    """An installed library lacks what the daemon relies on; the message names versions."""


class WriteError(IngestError):
    """A write to MongoDB failed as a whole and may be retried."""

    retriable = True


class RefusedWriteError(WriteError):
    """MongoDB or the driver refused a whole request for its data; retrying cannot help.

    The pipeline splits the request to isolate the readings at fault.
    """

    retriable = False


class SchemaGoneError(WriteError):
    """A write named an index that does not exist (dropped, or a collection re-created).

    Retriable once the schema is ensured again: the pipeline does that before retrying.
    """
