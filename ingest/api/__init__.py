"""``ingest api``: the read API over either layout, its queries and parameters, the page.

``server`` serves the endpoints and the page (``web/``); ``read_queries`` builds the
aggregation pipelines of each question for each layout; ``query_params`` parses and
checks the query strings; ``openapi`` describes the API. May import the store, the
settings, the metrics and the shared model; never the broker side, the devices' formats or
the pipeline (tests/test_layout.py).
"""
