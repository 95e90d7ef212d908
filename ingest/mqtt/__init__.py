"""The broker side: connect, subscribe, read, hand out messages, acknowledge after write.

Owns the MQTT session (``source``: reconnects with backoff, the read buffer and its
backpressure), the acknowledgement ledger (``acks``: which written message gets its
PUBACK, when and on which connection), the one place that reaches into paho-mqtt
(``paho_hooks``) and the lock that keeps one live process per client id
(``client_lock``). May import ``ingest.config``, ``ingest.metrics``, ``ingest.model``,
``ingest.errors`` and ``ingest.retry``; never the store, the devices' formats, the
pipeline or the API (tests/test_layout.py).
"""
