"""Sample streams in-process on a real Redis (7 and the embedded 6.2): whole groups, consumer
groups with explicit ack, redelivery after an idle timeout, counted staleness drops, trimming
of consumed and expired groups, reply-size overflow, the budget, and validation."""

from __future__ import annotations

import time

import numpy as np
import pytest

from meshrl.api.common.v1 import tensor_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.codec import Batch, Ragged, batch_from_proto, batch_to_proto
from meshrl.common.errors import InvalidArgument, ResourceExhausted
from tests._databuffer import snapshot


def group(gid: str, version: int, n: int = 4, pad: int = 0) -> pb.SampleGroup:
    rows = Ragged.from_rows([np.arange(i + 1, dtype=np.int32) for i in range(n)])
    cols = {"response_ids": rows, "rewards": np.arange(n, dtype=np.float32)}
    if pad:
        cols["pad"] = np.zeros((n, pad), np.uint8)
    samples = [tensor_pb2.SampleMeta(group_id=gid, index_in_group=i, weight_version=version) for i in range(n)]
    return pb.SampleGroup(group_id=gid, weight_version=version, batch=batch_to_proto(Batch(cols, samples)))


def test_whole_groups_are_delivered_once_and_acked(buffer):
    ids = buffer.append_groups("job", "s", [group("a", 1), group("b", 1, n=2)])
    result = buffer.read_groups("job", "s", "train", "c1", max_groups=10)
    assert [d.entry_id for d in result.groups] == ids and result.dropped_stale == 0
    first = batch_from_proto(result.groups[0].group.batch)
    assert first.num_rows() == 4 and [s.index_in_group for s in first.samples] == [0, 1, 2, 3]
    assert [r.tolist() for r in first["response_ids"].rows()] == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]
    assert all(d.delivery_count == 1 for d in result.groups)
    assert buffer.read_groups("job", "s", "train", "c2", max_groups=10).groups == []
    assert buffer.ack_groups("job", "s", "train", ids) == 2
    assert buffer.ack_groups("job", "s", "train", ids) == 0, "an id acked twice counts once"


def test_stale_groups_are_dropped_acked_and_counted(buffer):
    buffer.append_groups("job", "s", [group("v1", 1), group("v2", 2), group("v3", 3)])
    result = buffer.read_groups("job", "s", "train", "c", max_groups=10, min_weight_version=2)
    assert [d.group.group_id for d in result.groups] == ["v2", "v3"] and result.dropped_stale == 1
    stats = buffer.stats("job")
    assert stats.drops_by_reason == {"stale": 1}
    assert [(s.pending, s.lag) for s in stats.streams] == [(2, 0)], "the stale group is acked, not left pending"


def test_default_staleness_bound_follows_the_newest_version(make_buffer):
    buffer = make_buffer(streams={"max_version_lag": 1})
    buffer.append_groups("job", "s", [group("old", 5), group("ok", 6), group("new", 7)])
    result = buffer.read_groups("job", "s", "train", "c", max_groups=10)
    assert [d.group.group_id for d in result.groups] == ["ok", "new"] and result.dropped_stale == 1


def test_unacked_groups_of_a_dead_consumer_are_claimed_after_the_idle_timeout(buffer):
    ids = buffer.append_groups("job", "s", [group("a", 1), group("b", 1), group("c", 1)])
    taken = buffer.read_groups("job", "s", "train", "dies", max_groups=2)
    assert [d.entry_id for d in taken.groups] == ids[:2]
    early = buffer.read_groups("job", "s", "train", "heir", max_groups=5, claim_idle_seconds=0.4)
    assert [d.entry_id for d in early.groups] == ids[2:], "not idle long enough yet: only the new group"
    assert buffer.ack_groups("job", "s", "train", ids[2:]) == 1  # a live consumer acks before the timeout
    time.sleep(0.5)
    late = buffer.read_groups("job", "s", "train", "heir", max_groups=5, claim_idle_seconds=0.4)
    assert [(d.entry_id, d.delivery_count) for d in late.groups] == [(ids[0], 2), (ids[1], 2)]
    assert buffer.ack_groups("job", "s", "train", ids) == 2


def test_acked_groups_are_trimmed_once_every_consumer_group_has_them(buffer):
    ids = buffer.append_groups("job", "s", [group(str(i), 1) for i in range(4)])
    buffer.read_groups("job", "s", "train", "c", max_groups=10)
    buffer.read_groups("job", "s", "eval", "c", max_groups=10)
    assert buffer.ack_groups("job", "s", "train", ids) == 4
    assert buffer.streams.client.xlen(buffer.keys.stream("job", "s")) == 4, "'eval' has not acked yet"
    assert buffer.ack_groups("job", "s", "eval", ids[:3]) == 3
    assert buffer.streams.client.xlen(buffer.keys.stream("job", "s")) == 1
    assert buffer.ack_groups("job", "s", "eval", ids[3:]) == 1
    stats = buffer.stats("job")
    assert stats.bytes == 0 and stats.used_entries == 0 and stats.used_bytes == 0
    assert [(s.consumer_group, s.length) for s in stats.streams] == [("eval", 0), ("train", 0)]


def test_groups_older_than_the_stream_ttl_are_trimmed_and_counted(make_buffer):
    buffer = make_buffer(streams={"ttl_seconds": 1})
    buffer.append_groups("job", "s", [group("old", 1)])
    buffer.read_groups("job", "s", "train", "c")  # delivered, never acked
    time.sleep(1.1)
    buffer.append_groups("job", "s", [group("new", 1)])
    stats = buffer.stats("job")
    assert stats.drops_by_reason == {"expired": 1}
    assert [(s.length, s.pending, s.lag) for s in stats.streams] == [(1, 0, 1)]
    assert stats.used_entries == 1


def test_a_reply_over_the_size_limit_hands_the_rest_back_at_once(make_buffer):
    buffer = make_buffer(limits={"max_request_bytes": 20_000})
    ids = [i for n in range(4) for i in buffer.append_groups("job", "s", [group(str(n), 1, pad=2_000)])]  # ~8 KB each
    first = buffer.read_groups("job", "s", "train", "c1", max_groups=4)
    assert [d.entry_id for d in first.groups] == ids[:2]
    rest = buffer.read_groups("job", "s", "train", "c2", max_groups=4)  # default claim idle is 60 s
    assert [d.entry_id for d in rest.groups] == ids[2:]


def test_lag_and_pending_in_stats(buffer):
    buffer.append_groups("job", "s", [group(str(i), 1) for i in range(5)])
    buffer.read_groups("job", "s", "train", "c", max_groups=2)
    (stat,) = buffer.stats("job").streams
    assert (stat.stream, stat.consumer_group, stat.length, stat.pending, stat.lag) == ("s", "train", 5, 2, 3)


def test_budget_refuses_appends(make_buffer, backend):
    buffer = make_buffer(budget={"max_entries": 3})
    buffer.append_groups("job", "s", [group("a", 1), group("b", 1)])
    before = snapshot(backend[1], buffer.keys.prefix)
    with pytest.raises(ResourceExhausted, match=r"2 of budget.max_entries = 3 entries"):
        buffer.append_groups("job", "s", [group("c", 1), group("d", 1)])
    assert snapshot(backend[1], buffer.keys.prefix) == before


def test_bad_appends_and_acks_name_the_field_and_change_nothing(buffer, backend):
    buffer.append_groups("job", "s", [group("ok", 1)])
    before = snapshot(backend[1], buffer.keys.prefix)
    bad_bytes = group("x", 1)
    bad_bytes.batch.tensors[1].data = b"\x00" * 3
    no_id = group("", 1)
    negative = group("neg", -1)
    cases = [
        ([], r"^groups is empty"),
        ([group("fine", 1), bad_bytes], r"^groups\[1\].batch.tensors\['rewards'\] carries 3 bytes but nbytes = 16"),
        ([no_id], r"^groups\[0\].group_id must be 1-256 characters"),
        ([negative], r"^groups\[0\].weight_version = -1 must be >= 0"),
        ([pb.SampleGroup(group_id="e", batch=tensor_pb2.TensorBatch())], r"^groups\[0\].batch has no rows"),
    ]
    for groups, match in cases:
        with pytest.raises(InvalidArgument, match=match):
            buffer.append_groups("job", "s", groups)
    with pytest.raises(InvalidArgument, match=r"^stream = 'bad stream' is not a valid name"):
        buffer.append_groups("job", "bad stream", [group("a", 1)])
    with pytest.raises(InvalidArgument, match=r"^entry_ids\[1\] = 'nope' is not a stream entry id"):
        buffer.ack_groups("job", "s", "train", ["1-0", "nope"])
    with pytest.raises(InvalidArgument, match=r"^consumer = '' is not a valid name"):
        buffer.read_groups("job", "s", "train", "")
    with pytest.raises(InvalidArgument, match=r"^max_groups = 20000 must be in"):
        buffer.read_groups("job", "s", "train", "c", max_groups=20_000)
    assert snapshot(backend[1], buffer.keys.prefix) == before


def test_delete_job_removes_streams_and_their_budget(buffer):
    buffer.append_groups("job", "s1", [group("a", 1)])
    buffer.append_groups("job", "s2", [group("b", 1)])
    buffer.read_groups("job", "s1", "train", "c")
    assert buffer.delete_job("job") == (0, 2)
    stats = buffer.stats()
    assert stats.streams == [] and stats.used_entries == 0
    assert buffer.read_groups("job", "s1", "train", "c").groups == [], "a deleted stream starts empty again"
