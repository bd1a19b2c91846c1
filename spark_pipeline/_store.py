"""The data source's calls to the store, through one blocking client opened on first use.

Every Spark-side object -- the planner's stream reader, a task's reader or writer, the driver's
commit -- runs in a Python process of its own and is pickled there without connections, so each
opens its client lazily (``StoreSession.client``) and closes it when it is done.  The calls made on
the controller are gathered here with their errors translated into what the query should say.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import millstream
from millstream.client import ReaderGroupConfig, SegmentSlice, StreamCut
from millstream.errors import (
    InvalidStreamCutError,
    ReaderGroupExistsError,
    ReaderGroupNotFoundError,
    TruncatedDataError,
)
from millstream.spark._errors import OptionError
from millstream.spark._options import StoreOptions

__all__ = ["StoreSession"]

T = TypeVar("T")


class StoreSession:
    """A lazily opened blocking client for ``options`` (controller URI and token) and the stream's
    controller calls.  Not picklable with an open client: owners drop it when pickled."""

    def __init__(self, options: StoreOptions) -> None:
        self.options = options
        self._client: millstream.Client | None = None

    @property
    def client(self) -> millstream.Client:
        if self._client is None:
            self._client = millstream.connect(self.options.controller, token=self.options.token)
        return self._client

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.client.run(coroutine)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_client": None}

    # --- Stream cuts ---------------------------------------------------------------------------------

    def head(self) -> StreamCut:
        return self.client.stream_manager().head_cut(self.options.stream)

    def tail(self) -> StreamCut:
        return self.client.stream_manager().tail_cut(self.options.stream)

    def check_exists(self) -> None:
        """Raise ``OptionError`` naming ``stream`` if the stream (or its scope) does not exist."""
        try:
            self.client.stream_manager().describe_stream(self.options.stream)
        except LookupError as error:  # ScopeNotFoundError, StreamNotFoundError
            raise OptionError("stream", f"{self.options.stream!r} does not exist ({error})") from None

    def between(self, start: StreamCut, end: StreamCut | None) -> list[SegmentSlice]:
        """``get_segments_between(start, end)``; a start the stream's head has passed is
        ``TruncatedDataError`` (retention deleted what the query still had to read)."""
        controller = self.client.async_client.controller()
        try:
            return self.run(controller.get_segments_between(self.options.scope, self.options.stream_name, start, end))
        except InvalidStreamCutError as error:
            head = self.head()
            try:
                self.run(controller.check_stream_cut(self.options.scope, self.options.stream_name, start))
            except InvalidStreamCutError:
                raise TruncatedDataError(
                    f"the query's position in {self.options.stream} ({start.to_json()}) lies before the stream's "
                    f"head ({head.to_json()}): retention or truncation deleted events the query had not read, and the "
                    "source does not skip them. Start a new query (a new checkpoint, option start=head) to go on "
                    "from the head") from None
            raise error from None

    # --- The query's reader group (consumption-based retention) -------------------------------------

    def register_group(self, scope: str, group: str) -> None:
        """Create reader group ``scope/group`` subscribing to the stream for consumption-based
        retention, or check that the existing one reads it."""
        controller = self.client.async_client.controller()
        config = ReaderGroupConfig([self.options.stream], automatic_checkpoint_seconds=0, retention="consumption")
        try:
            self.run(controller.create_reader_group(scope, group, config))
            return
        except ReaderGroupExistsError:
            pass
        except LookupError as error:  # the group's scope does not exist
            raise OptionError("readerGroup", f"{scope}/{group}: {error}") from None
        try:
            info = self.run(controller.get_reader_group(scope, group))
        except ReaderGroupNotFoundError:  # deleted meanwhile: create it again
            self.run(controller.create_reader_group(scope, group, config))
            return
        if self.options.stream not in info.config.streams or info.config.retention != "consumption":
            raise OptionError("readerGroup", f"reader group {scope}/{group} exists and does not subscribe to "
                                             f"{self.options.stream} for consumption-based retention; name another")

    def publish(self, scope: str, group: str, cut: StreamCut) -> None:
        """Record ``cut`` as the group's subscriber cut of the stream."""
        controller = self.client.async_client.controller()
        self.run(controller.update_subscriber_cut(scope, group, self.options.stream, cut))
