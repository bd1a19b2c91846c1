"""The columnar batch path's framing: a whole column of events framed in a few vectorised passes.

Theory of operation.  ``write_columns`` (and ``write_events`` on a list of ``bytes``, when Arrow is
installed) holds its events as one Arrow binary column: a data buffer and offsets.  Cutting a
``bytes`` object per event from it, sorting them by segment and framing them one by one costs more
than the writer's own work per event.  Here the batch stays in columns until its blocks are made:

1. *Keys*, by value: ``dictionary_encode`` gives each event the index of its key among the batch's
   distinct keys (``KeyColumn``); the writer routes each distinct key once -- through the router's
   memo (``_routing``), which a scale empties, so a key is routed by the view in force -- and one
   NumPy gather gives every event its segment.
2. *Grouping*: a stable ``argsort`` of the events' segments puts each segment's events together, in
   the batch's order (so a key's events keep their order), and ``bincount`` says how many each has.
3. *Framing*: Arrow's ``take`` gathers the payloads in that order, and ``binary_join_element_wise``
   puts each event's header (``type 0 | length``, built for all events at once in NumPy) before its
   payload: the result's data buffer is the framed events of every segment, one after another
   (``FramedRun``: a segment's events as one ``bytes``, their framed offsets and cumulative charges).

The segment writer's machine cuts blocks out of a run's bytes (``SegmentWriterState.write_framed``),
and a block is those bytes: what the idempotent writer re-sends after a reconnect, as it would any
block.  What stays per event is a key reference and a place in the writer's sequence per event (kept
until acknowledged, for re-routing after a seal and for the in-doubt set).

NumPy and pyarrow are imported only here, and only by the columnar path (``import millstream`` needs
neither; without them the batch path cuts ``bytes`` per event, as before).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from millstream import limits
from millstream.errors import InvalidArgumentError, PayloadTooLargeError

__all__ = ["ColumnBatch", "FramedRun", "KeyRoutes", "RoutedKeys", "arrow_values", "bytes_batch", "column_batch",
           "frame_runs", "slice_bounds"]

#: Framing header bytes per event (``type`` and ``length``, two big-endian int32).
HEADER_LENGTH: Final = 8
#: The most bytes an Arrow ``binary`` array (32-bit offsets) holds.
INT32_MAX: Final = 2**31 - 1


class ColumnBatch:
    """A checked columnar batch: ``values`` an Arrow binary or large_binary array without nulls,
    ``lengths`` its events' payload lengths (NumPy int64) and ``keys`` their routing keys (an Arrow
    string array without nulls) -- and, for a ``write_events`` batch, the same keys as the caller's
    ``str`` objects (``key_list``), which ``KeyRoutes`` looks up by dict instead of hashing its
    whole table in Arrow."""

    __slots__ = ("key_list", "keys", "lengths", "values")

    def __init__(self, values: Any, lengths: Any, keys: Any, key_list: list[str] | None = None) -> None:
        self.values = values
        self.lengths = lengths
        self.keys = keys
        self.key_list = key_list

    def __len__(self) -> int:
        return len(self.values)

    def slice(self, start: int, end: int) -> ColumnBatch:
        """Events ``[start, end)`` (no copy of the columns)."""
        key_list = self.key_list
        return ColumnBatch(self.values.slice(start, end - start), self.lengths[start:end],
                           self.keys.slice(start, end - start), None if key_list is None else key_list[start:end])

    def payloads(self, positions: list[int]) -> list[bytes]:
        """The payloads of events at ``positions`` as ``bytes`` (the rare per-event path: re-routing)."""
        return list(self.values.take(positions).to_pylist())

    def routing_keys(self, positions: list[int]) -> list[str | None]:
        """The routing keys of events at ``positions`` (the same rare path)."""
        return list(self.keys.take(positions).to_pylist())


class KeyRoutes:
    """A writer's routes for the keys its columnar batches carry, as columns: ``keys`` (Arrow), the
    same keys as ``str`` (``objects``, NumPy object array: what blocks keep), their characters
    (``lengths``) and their segments (``segments``: indexes into ``names``).  Made for one view of
    the router (``generation``): the writer drops it when the view changes (a scale), as the router
    empties its memo, so a key is routed by the view in force.  Bounded like the memo: when it would
    hold more than ``size_max`` keys it starts again from the batch's keys.

    A batch's keys find their rows in one of two ways.  ``pc.index_in`` against ``keys`` builds a
    hash table of every key in the routes for each batch: about 0.1 µs per key known plus 0.12 per
    event -- cheap for a batch as large as the routes, not for a smaller one (10,000 keys known,
    batches of 1,000: 1.1 µs/event, more than the rest of the batch's framing).  A ``write_events``
    batch holds its keys as ``str`` too (``ColumnBatch.key_list``): when it is smaller than the
    routes, they find their rows in ``_row_of``, a dict kept beside the columns, looked up per
    event in C (about 0.23 µs/event, hashing included, whatever the routes hold)."""

    __slots__ = ("_index_of", "_lock", "_row_of", "_size_max", "generation", "keys", "lengths", "names", "objects",
                 "segments")

    def __init__(self, generation: int, size_max: int = limits.CLIENT_ROUTING_KEY_CACHE_SIZE_MAX) -> None:
        self.generation = generation
        self._size_max = size_max
        self.names: list[str] = []  # (only appended to: an index into it stays valid)
        self._index_of: dict[str, int] = {}
        # Threads writing through one writer share its routes: one routes at a time, and each batch
        # frames by the columns it was routed with (``RoutedKeys``), whatever is added or cleared after.
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        modules = _modules()
        assert modules is not None  # (only column_batch's batches come here)
        numpy, pa, _ = modules
        self.keys = pa.array([], type=pa.string())
        self._row_of: dict[str, int] = {}  # key -> its row in the columns
        self.objects = numpy.empty(0, dtype=object)
        self.lengths = numpy.empty(0, dtype=numpy.int64)
        self.segments = numpy.empty(0, dtype=numpy.intp)

    def route(self, keys: Any, segment_for: Callable[[str], str], key_list: list[str] | None = None) -> RoutedKeys:
        """``keys`` (an Arrow string array; ``key_list``, if given, the same keys as ``str``) routed:
        each one's index into the routes' columns, routing the keys not seen yet with ``segment_for``
        (once each)."""
        with self._lock:
            if key_list is not None and len(key_list) < len(self.keys):
                return self._route_list_locked(key_list, segment_for)
            return self._route_locked(keys, segment_for)

    def _route_locked(self, keys: Any, segment_for: Callable[[str], str]) -> RoutedKeys:
        modules = _modules()
        assert modules is not None
        _, _, pc = modules
        indexes = pc.index_in(keys, value_set=self.keys)
        if indexes.null_count:
            missing = pc.unique(keys.filter(pc.is_null(indexes)))
            if len(self.keys) + len(missing) > self._size_max:
                self._clear()
                missing = pc.unique(keys)
            self._add_locked(missing.to_pylist(), missing, segment_for)
            indexes = pc.index_in(keys, value_set=self.keys)
        return RoutedKeys(indexes.to_numpy(zero_copy_only=False), self.segments, self.objects, self.lengths, self.names)

    def _route_list_locked(self, key_list: list[str], segment_for: Callable[[str], str]) -> RoutedKeys:
        """``_route_locked`` for keys held as ``str``: their rows by dict (see the class docstring)."""
        modules = _modules()
        assert modules is not None
        numpy, pa, _ = modules
        count = len(key_list)
        try:
            indexes = numpy.fromiter(map(self._row_of.__getitem__, key_list), dtype=numpy.intp, count=count)
        except KeyError:  # keys not seen yet: route them (once each, in the order they first appear)
            row_of = self._row_of
            missing = [key for key in dict.fromkeys(key_list) if key not in row_of]
            if len(self.keys) + len(missing) > self._size_max:
                self._clear()
                missing = list(dict.fromkeys(key_list))
            self._add_locked(missing, pa.array(missing, type=pa.string()), segment_for)
            indexes = numpy.fromiter(map(self._row_of.__getitem__, key_list), dtype=numpy.intp, count=count)
        return RoutedKeys(indexes, self.segments, self.objects, self.lengths, self.names)

    def _add_locked(self, new: list[str], arrow: Any, segment_for: Callable[[str], str]) -> None:
        """Route the keys ``new`` (``arrow``: the same, as an Arrow string array), none of them in the
        routes yet, and append them to the columns."""
        modules = _modules()
        assert modules is not None
        numpy, pa, _ = modules
        index_of = self._index_of
        names = self.names
        segments = []
        for key in new:
            name = segment_for(key)
            index = index_of.get(name)
            if index is None:
                index = index_of[name] = len(names)
                names.append(name)
            segments.append(index)
        objects = numpy.empty(len(new), dtype=object)
        objects[:] = new
        first_row = len(self.keys)
        self._row_of.update(zip(new, range(first_row, first_row + len(new)), strict=True))
        self.keys = pa.concat_arrays([self.keys, arrow])
        self.objects = numpy.concatenate([self.objects, objects])
        self.lengths = numpy.concatenate([self.lengths, numpy.fromiter(map(len, new), dtype=numpy.int64,
                                                                       count=len(new))])
        self.segments = numpy.concatenate([self.segments, numpy.asarray(segments, dtype=numpy.intp)])


class RoutedKeys:
    """A batch's keys as routed: ``indexes[i]`` is event ``i``'s row in the routes' columns as they
    were then -- ``segments`` (indexes into ``names``), ``objects`` (the keys as ``str``) and
    ``lengths`` (their characters)."""

    __slots__ = ("indexes", "lengths", "names", "objects", "segments")

    def __init__(self, indexes: Any, segments: Any, objects: Any, lengths: Any, names: list[str]) -> None:
        self.indexes = indexes
        self.segments = segments
        self.objects = objects
        self.lengths = lengths
        self.names = names


class FramedRun:
    """One segment's events of a batch, framed: ``data`` the events, ``framed_ends`` (``len + 1``) their
    boundaries in it, ``charge_ends`` (``len + 1``) what events ``0..i-1`` are charged (framed bytes
    and keys' characters), ``routing_keys`` the events' keys and ``positions`` (NumPy) their indexes
    in the batch, in order."""

    __slots__ = ("charge_ends", "data", "framed_ends", "positions", "routing_keys", "segment")

    def __init__(self, segment: str, data: bytes, framed_ends: Any, charge_ends: Any,
                 routing_keys: list[str | None], positions: Any) -> None:
        self.segment = segment
        self.data = data
        self.framed_ends = framed_ends
        self.charge_ends = charge_ends
        self.routing_keys = routing_keys
        self.positions = positions


def _modules() -> tuple[Any, Any, Any] | None:
    """``(numpy, pyarrow, pyarrow.compute)``, or None if either is missing."""
    try:
        import numpy
        import pyarrow
        import pyarrow.compute
    except ImportError:
        return None
    return numpy, pyarrow, pyarrow.compute


def column_batch(values: Any, routing_keys: Any) -> ColumnBatch | None:
    """``values`` (an Arrow binary/large_binary array, checked by the caller: no nulls) with
    ``routing_keys`` (an Arrow string array or a sequence of ``str``) as a ``ColumnBatch`` -- or None
    when this path does not apply: NumPy or pyarrow missing, no keys, a null key (keyless events are
    spread one by one) or a key that is not a ``str`` (the per-event path names it).  Raises
    ``InvalidArgumentError`` (not one key per value) and ``PayloadTooLargeError`` (an event over
    ``limits.EVENT_LENGTH_BYTES_MAX``, by index), before anything is written."""
    modules = _modules()
    if modules is None or routing_keys is None:
        return None
    numpy, pa, _ = modules
    if isinstance(routing_keys, pa.ChunkedArray):
        routing_keys = routing_keys.combine_chunks()
    if not isinstance(routing_keys, pa.Array):
        if not isinstance(routing_keys, Sequence) or not set(map(type, routing_keys)) <= {str}:
            return None  # (Arrow would take bytes for text: the per-event path refuses them, by name)
        try:
            routing_keys = pa.array(routing_keys, type=pa.string())
        except (pa.ArrowException, TypeError, ValueError):
            return None
    if pa.types.is_large_string(routing_keys.type):
        routing_keys = routing_keys.cast(pa.string())
    if not pa.types.is_string(routing_keys.type) or routing_keys.null_count:
        return None
    count = len(values)
    if len(routing_keys) != count:
        raise InvalidArgumentError(f"write_columns got {count} values and {len(routing_keys)} routing keys: give one "
                                   "key per value (or routing_keys=None)")
    lengths = numpy.diff(_offsets(numpy, pa, values))
    if count and int(lengths.max()) > limits.EVENT_LENGTH_BYTES_MAX:
        index = int(lengths.argmax())
        raise PayloadTooLargeError(f"event {index} of the batch has {int(lengths[index])} bytes, over the limit of "
                                   f"{limits.EVENT_LENGTH_BYTES_MAX} bytes: nothing of the batch was written")
    return ColumnBatch(values, lengths, routing_keys)


def bytes_batch(payloads: list[bytes], routing_keys: list[str | None]) -> ColumnBatch | None:
    """A checked ``write_events`` batch (``bytes`` payloads, one ``str`` or None key each) as a
    ``ColumnBatch`` (its payloads and keys copied into Arrow columns: one C loop each, cheaper than
    framing them one by one) -- or None when the columnar path does not apply (see ``column_batch``)."""
    modules = _modules()
    if modules is None or not payloads or None in routing_keys:
        return None
    _, pa, _ = modules
    # large_binary: 64-bit offsets, so a batch over 2 GiB stays one array.
    batch = column_batch(pa.array(payloads, type=pa.large_binary()), pa.array(routing_keys, type=pa.string()))
    if batch is not None:
        batch.key_list = cast(list[str], routing_keys)  # (no None: checked above)
    return batch


def arrow_values(buffer: Any, offsets: Any) -> Any | None:
    """A ``(buffer, offsets)`` pair as an Arrow large_binary array (no copy of the buffer), or None
    if NumPy or pyarrow is missing.  The caller checked the pair (offsets rise within the buffer)."""
    modules = _modules()
    if modules is None:
        return None
    numpy, pa, _ = modules
    ends = numpy.asarray(offsets, dtype=numpy.int64)
    return pa.Array.from_buffers(pa.large_binary(), len(ends) - 1, [None, pa.py_buffer(ends), pa.py_buffer(buffer)])


def _offsets(numpy: Any, pa: Any, values: Any) -> Any:
    """The ``len + 1`` offsets of an Arrow binary/large_binary array (NumPy int64, from 0)."""
    large = pa.types.is_large_binary(values.type)
    buffer = values.buffers()[1]
    first = values.offset
    offsets = numpy.frombuffer(buffer, dtype=numpy.int64 if large else numpy.int32)[first:first + len(values) + 1]
    return offsets.astype(numpy.int64) - int(offsets[0])


def slice_bounds(batch: ColumnBatch, slice_bytes_max: int) -> list[tuple[int, int]]:
    """``[start, end)`` slices of ``batch`` of at most ``slice_bytes_max`` framed bytes each (and at
    least one event), as ``_writer.AsyncEventStreamWriter._batch_slices`` cuts a list of payloads."""
    import numpy

    count = len(batch)
    if not count:
        return []
    ends = numpy.cumsum(batch.lengths + HEADER_LENGTH)
    slices = []
    start = 0
    base = 0
    while start < count:
        end = min(int(numpy.searchsorted(ends, base + slice_bytes_max, side="left")) + 1, count)
        end = max(end, start + 1)
        slices.append((start, end))
        base = int(ends[end - 1])
        start = end
    return slices


def frame_runs(batch: ColumnBatch, routes: RoutedKeys) -> list[FramedRun]:
    """Group ``batch``'s events by segment (``routes``: its keys, routed),
    keeping the batch's order within each, and frame each segment's events (see the module
    docstring).  One ``FramedRun`` per segment that has events."""
    modules = _modules()
    assert modules is not None  # (column_batch made the batch)
    numpy, pa, pc = modules
    count = len(batch)
    values = batch.values
    if pa.types.is_binary(values.type) and int(batch.lengths.sum()) + HEADER_LENGTH * count > INT32_MAX:
        values = values.cast(pa.large_binary())  # (framed, it would outgrow 32-bit offsets)
    names = routes.names
    key_indexes = routes.indexes
    segments = routes.segments[key_indexes]
    if len(names) == 1:
        order = None
        counts = [count]
        lengths = batch.lengths
    else:
        order = numpy.argsort(segments, kind="stable")
        counts = numpy.bincount(segments, minlength=len(names)).tolist()
        values = pc.take(values, pa.array(order))
        lengths = batch.lengths[order]
        key_indexes = key_indexes[order]
    large = pa.types.is_large_binary(values.type)
    headers = numpy.zeros((count, 2), dtype=">i4")
    headers[:, 1] = lengths
    header_offsets = numpy.arange(0, HEADER_LENGTH * count + 1, HEADER_LENGTH,
                                  dtype=numpy.int64 if large else numpy.int32)
    header_column = pa.Array.from_buffers(values.type, count, [None, pa.py_buffer(header_offsets),
                                                               pa.py_buffer(headers)])
    framed = pc.binary_join_element_wise(header_column, values, pa.scalar(b"", type=values.type))
    framed_ends = _offsets(numpy, pa, framed)
    start_byte = int(numpy.frombuffer(framed.buffers()[1], dtype=numpy.int64 if large else numpy.int32)[framed.offset])
    data = memoryview(framed.buffers()[2])[start_byte:]  # (framed_ends count from here)
    charges = numpy.empty(count + 1, dtype=numpy.int64)
    charges[0] = 0
    numpy.cumsum(lengths + (routes.lengths[key_indexes] + HEADER_LENGTH), out=charges[1:])
    event_keys = routes.objects[key_indexes]  # (references to the routes' keys: no new objects)
    runs = []
    first = 0
    for segment_index, run_count in enumerate(counts):
        if not run_count:
            continue
        last = first + run_count
        begin = int(framed_ends[first])
        run_data = data[begin:int(framed_ends[last])].tobytes()
        run_ends = framed_ends[first:last + 1] - begin
        run_charges = charges[first:last + 1] - charges[first]
        positions = numpy.arange(first, last) if order is None else order[first:last]
        runs.append(FramedRun(names[segment_index], run_data, run_ends, run_charges,
                              event_keys[first:last].tolist(), positions))
        first = last
    return runs
