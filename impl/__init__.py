"""millstream: a durable, elastic, exactly-once stream store."""

__version__ = "0.1.0"
