"""MongoDB: the writers of both layouts, the schema, sharding and the error classes.

``writers/`` builds and sends the statements of bucket and time-series mode (and the
rejects collection); ``schema`` creates collections, validators and indexes; ``sharding``
shards a collection; ``mongo_errors`` is the one place that reads the server's error
codes; ``persist`` retries the stateful formats' state writes; ``layout_queries`` holds
the natural queries of each layout. May import ``ingest.model``, ``ingest.errors`` and
``ingest.retry`` only: the store never imports the formats, the pipeline or the API
(tests/test_layout.py).
"""
