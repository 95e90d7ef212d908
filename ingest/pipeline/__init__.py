"""The daemon's stages and lifecycle: decode, batch, write, acknowledge.

``app`` wires the stages as named tasks and runs the two-stage shutdown; ``stages``
decodes each message (the default format, or the mapping rules), batches, writes through
the store and hands the written messages back to be acknowledged; ``batcher`` closes a
batch at a size or after a linger; ``retained`` decides about retained states;
``workers``, ``workers_endpoint`` and ``worker_sessions`` run ``--workers N``. The top
room of the daemon: it may import every room below it (mqtt, devices, store, config,
metrics), never the API or the commands (tests/test_layout.py).
"""
