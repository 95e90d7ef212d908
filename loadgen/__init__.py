"""Sensor fleet simulator and bucket-vs-time-series benchmark (see the open issue)."""
