"""millstream.spark: the Spark Structured Streaming source and exactly-once sink (arrives with issue 7)."""
