"""The controller's replies on the wire, pinned: every reply kind, as ``ControllerRpc`` sends it,
is exactly these bytes (canonical JSON).  The client stub (``impl/millstream/client/_controller.py``) and every
deployed client decode these objects, so a change to the controller's return values (issue 22 item 3:
typed values instead of dicts) must leave them byte for byte as they are."""

from __future__ import annotations

import json
import random
from typing import Any, Final

from millstream.controller import METHODS, ControllerRpc
from millstream.naming import stream_segment_name
from millstream.values import ReaderGroupConfig, ScalingPolicy, StreamConfig, canonical_json
from tests.controller.helpers import append_events, harness, run

STREAM = {"scope": "iot", "stream": "s"}
GROUP = {"scope": "iot", "group": "g"}
FIXED2 = StreamConfig(scaling=ScalingPolicy.fixed(2)).to_json_object()
GROUP_CONFIG = ReaderGroupConfig(["iot/s"]).to_json_object()


#: Each call's reply, in order, byte for byte (``{uri}`` stands for the server's own address).
EXPECTED: Final = [
    ('create_scope',
     '{}'),
    ('list_scopes',
     '{"scopes":["iot"]}'),
    ('create_stream',
     '{}'),
    ('update_stream',
     '{}'),
    ('get_stream',
     '{"config":{"retention":{"limit":0.0,"type":"none"},"scaling":{"min_segments":2,"scale_factor":0,"target_rate":0.0,"type":"fixed"}},"epoch":0,"sealed":false,"segments":[{"id":0,"key_end":0.5,"key_start":0.0,"name":"iot/s/0.#epoch.0"},{"id":1,"key_end":1.0,"key_start":0.5,"name":"iot/s/1.#epoch.0"}],"state":"active"}'),
    ('list_streams',
     '{"streams":["s"]}'),
    ('get_current_segments',
     '{"epoch":0,"segments":[{"id":0,"key_end":0.5,"key_start":0.0,"name":"iot/s/0.#epoch.0","uri":"{uri}"},{"id":1,"key_end":1.0,"key_start":0.5,"name":"iot/s/1.#epoch.0","uri":"{uri}"}]}'),
    ('scale_stream',
     '{"epoch":1}'),
    ('get_successors',
     '{"successors":[{"id":4294967298,"key_end":0.25,"key_start":0.0,"name":"iot/s/2.#epoch.1","predecessors":[0]},{"id":4294967299,"key_end":0.5,"key_start":0.25,"name":"iot/s/3.#epoch.1","predecessors":[0]}]}'),
    ('get_head_cut',
     '{"cut":{"0":0,"1":0}}'),
    ('get_tail_cut',
     '{"cut":{"1":0,"4294967298":0,"4294967299":0}}'),
    ('get_cut_at',
     '{"cut":{"0":0,"1":0}}'),
    ('check_stream_cut',
     '{}'),
    ('get_segments_between',
     '{"segments":[{"end_offset":54,"id":0,"key_end":0.5,"key_start":0.0,"name":"iot/s/0.#epoch.0","predecessors":[],"start_offset":0},{"end_offset":-1,"id":1,"key_end":1.0,"key_start":0.5,"name":"iot/s/1.#epoch.0","predecessors":[],"start_offset":0},{"end_offset":-1,"id":4294967298,"key_end":0.25,"key_start":0.0,"name":"iot/s/2.#epoch.1","predecessors":[0],"start_offset":0},{"end_offset":-1,"id":4294967299,"key_end":0.5,"key_start":0.25,"name":"iot/s/3.#epoch.1","predecessors":[0],"start_offset":0}]}'),
    ('truncate_stream',
     '{}'),
    ('create_reader_group',
     '{"state_segment":"iot/_RGg"}'),
    ('get_reader_group',
     '{"config":{"automatic_checkpoint_seconds":30.0,"retention":"none","streams":{"iot/s":{"end":null,"start":null}}},"generation":0,"state_segment":"iot/_RGg"}'),
    ('update_reader_group',
     '{"generation":1}'),
    ('list_reader_groups',
     '{"groups":["g"]}'),
    ('update_subscriber_cut',
     '{}'),
    ('get_segment_uri',
     '{"uri":"{uri}"}'),
    ('create_transaction',
     '{"deadline":1000030.0,"epoch":1,"lease":30.0,"opened":1000000.0,"order":0,"segments":[{"id":4294967298,"key_end":0.25,"key_start":0.0,"name":"iot/s/2.#epoch.1"},{"id":4294967299,"key_end":0.5,"key_start":0.25,"name":"iot/s/3.#epoch.1"},{"id":1,"key_end":1.0,"key_start":0.5,"name":"iot/s/1.#epoch.0"}],"status":"open","txn":"6513270e269e4d37b2a74de452e6b438"}'),
    ('ping_transaction',
     '{"deadline":1000030.0}'),
    ('get_transaction',
     '{"deadline":1000030.0,"epoch":1,"lease":30.0,"opened":1000000.0,"order":0,"segments":[{"id":4294967298,"key_end":0.25,"key_start":0.0,"name":"iot/s/2.#epoch.1"},{"id":4294967299,"key_end":0.5,"key_start":0.25,"name":"iot/s/3.#epoch.1"},{"id":1,"key_end":1.0,"key_start":0.5,"name":"iot/s/1.#epoch.0"}],"status":"open","txn":"6513270e269e4d37b2a74de452e6b438"}'),
    ('list_transactions',
     '{"transactions":[{"status":"open","txn":"6513270e269e4d37b2a74de452e6b438"}]}'),
    ('commit_transaction',
     '{"status":"committing"}'),
    ('create_transaction',
     '{"deadline":1000120.0,"epoch":1,"lease":120.0,"opened":1000000.0,"order":0,"segments":[{"id":4294967298,"key_end":0.25,"key_start":0.0,"name":"iot/s/2.#epoch.1"},{"id":4294967299,"key_end":0.5,"key_start":0.25,"name":"iot/s/3.#epoch.1"},{"id":1,"key_end":1.0,"key_start":0.5,"name":"iot/s/1.#epoch.0"}],"status":"open","txn":"d23f0824128b4f338c5c7fd0a6a3a450"}'),
    ('abort_transaction',
     '{"status":"aborting"}'),
    ('create_transaction',
     '{"deadline":1000120.0,"epoch":1,"lease":120.0,"opened":1000000.0,"order":0,"segments":[{"id":4294967298,"key_end":0.25,"key_start":0.0,"name":"iot/s/2.#epoch.1"},{"id":4294967299,"key_end":0.5,"key_start":0.25,"name":"iot/s/3.#epoch.1"},{"id":1,"key_end":1.0,"key_start":0.5,"name":"iot/s/1.#epoch.0"}],"status":"open","txn":"9531985d5d9d49f89818e811892f902b"}'),
    ('commit_transactions',
     '{"outcome":"committed","recorded":1}'),
    ('get_fence',
     '{"value":1}'),
    ('delete_reader_group',
     '{}'),
    ('seal_stream',
     '{}'),
    ('delete_stream',
     '{}'),
    ('delete_scope',
     '{}'),
]


def test_every_reply_kind_is_the_same_bytes_as_before() -> None:
    replies: list[tuple[str, dict[str, Any], bytes]] = []

    async def scenario() -> None:
        async with harness() as test:
            controller = await test.controller(transaction_workflows=False)
            controller._rng = random.Random(7)
            rpc = ControllerRpc(controller)

            async def call(method: str, body: dict[str, Any]) -> None:
                replies.append((method, body, await rpc.handle(method, canonical_json(body))))

            await call("create_scope", {"scope": "iot"})
            await call("list_scopes", {})
            await call("create_stream", {**STREAM, "config": FIXED2})
            await call("update_stream", {**STREAM, "config": FIXED2})
            await call("get_stream", STREAM)
            await call("list_streams", {"scope": "iot"})
            await call("get_current_segments", STREAM)
            await append_events(test, stream_segment_name("iot", "s", 0), 3)
            await call("scale_stream", {**STREAM, "seal": [0], "new_ranges": [[0.0, 0.25], [0.25, 0.5]]})
            await call("get_successors", {**STREAM, "segment_id": 0})
            await call("get_head_cut", STREAM)
            await call("get_tail_cut", STREAM)
            await call("get_cut_at", {**STREAM, "time": 2_000_000.0})
            await call("check_stream_cut", {**STREAM, "cut": {"0": 0, "1": 0}})
            await call("get_segments_between", {**STREAM, "from_cut": None, "to_cut": None})
            await call("truncate_stream", {**STREAM, "cut": {"0": 0, "1": 0}})
            await call("create_reader_group", {**GROUP, "config": GROUP_CONFIG})
            await call("get_reader_group", GROUP)
            await call("update_reader_group", {**GROUP, "config": GROUP_CONFIG,
                                               "expected_generation": 0})
            await call("list_reader_groups", {"scope": "iot"})
            await call("update_subscriber_cut", {**GROUP, "stream": "iot/s", "cut": {"0": 0, "1": 0}})
            await call("get_segment_uri", {"segment": stream_segment_name("iot", "s", 1)})
            await call("create_transaction", {**STREAM, "lease": 30.0})
            txn = json.loads(replies[-1][2])["txn"]
            await call("ping_transaction", {**STREAM, "txn": txn})
            await call("get_transaction", {**STREAM, "txn": txn})
            await call("list_transactions", STREAM)
            await call("commit_transaction", {**STREAM, "txn": txn})
            await call("create_transaction", {**STREAM})
            second = json.loads(replies[-1][2])["txn"]
            await call("abort_transaction", {**STREAM, "txn": second})
            await call("create_transaction", {**STREAM})
            third = json.loads(replies[-1][2])["txn"]
            await call("commit_transactions", {**STREAM, "txns": [third], "fence": ["k", 1]})
            await call("get_fence", {**STREAM, "key": "k"})
            await call("delete_reader_group", GROUP)
            await call("seal_stream", STREAM)
            await call("delete_stream", STREAM)
            await call("delete_scope", {"scope": "iot"})

    run(scenario)
    uri = json.loads(next(reply for method, _, reply in replies if method == "get_segment_uri"))["uri"]
    assert [method for method, _, _ in replies] == [method for method, _ in EXPECTED]
    for (method, body, reply), (_, expected) in zip(replies, EXPECTED, strict=True):
        assert reply.decode() == expected.replace("{uri}", uri), (method, body)
    assert {method for method, _, _ in replies} == set(METHODS)  # every reply kind is pinned
