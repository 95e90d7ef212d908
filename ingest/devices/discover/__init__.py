"""``ingest discover``: capture a broker's traffic, propose rules."""
