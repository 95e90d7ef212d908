"""MQTT to MongoDB time-series ingestion daemon."""

__version__ = "0.1.0"
