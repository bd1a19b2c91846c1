"""millstream: a durable, elastic, exactly-once stream store.

What exists so far is the segment store's container layer: ``SegmentContainer`` over a Tier-1
``DurableDataLog`` (``FileLog`` on local disk).  Streams, readers, the server and the Spark
pipeline build on it.  Errors live in ``millstream.errors``.
"""

from millstream import errors
from millstream.segmentstore.container import SegmentContainer, SegmentInfo
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.file_log import FileLog
from millstream.segmentstore.read_index import ReadResult

__version__ = "0.1.0"

__all__ = ["DurableDataLog", "FileLog", "ReadResult", "SegmentContainer", "SegmentInfo", "errors"]
