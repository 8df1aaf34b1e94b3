"""Every data-buffer RPC that changes state, sent bad input over real gRPC against a real Redis: each gets
its status code (naming the field) and leaves the store exactly as it was (every key under the buffer's
prefix compared by DUMP: batches, manifests, streams with their consumer groups and pending entries).

Mutating RPCs of databuffer.proto: PutBatch, PutSmallBatch, DeleteBatch, DeleteStep, DeleteJob,
AppendGroups, ReadGroups (it delivers and claims), AckGroups. PutBatch's malformed streams are covered one
by one in test_databuffer_service.py; here each RPC has its rows in one table.
"""

from __future__ import annotations

import re

import grpc
import numpy as np
import pytest
import redis

from meshrl.api.common.v1 import keys_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import encode_batch
from meshrl.common.databuffer_client import SERVICE, DataBufferClient, Group
from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, serving, snapshot, unique_prefix

BAD = grpc.StatusCode.INVALID_ARGUMENT


def _key(job="job", step=0, node="n") -> keys_pb2.BatchKey:
    return keys_pb2.BatchKey(job_id=job, step=step, node_id=node, shard=-1)


def _small(key: keys_pb2.BatchKey, cut: int = 0, **start) -> pb.PutSmallBatchRequest:
    header, views = encode_batch({"x": np.zeros(4, np.float32)})
    payload = b"".join(bytes(v) for v in views)
    return pb.PutSmallBatchRequest(start=pb.PutBatchStart(key=key, header=header, **start), payload=payload[cut:])


def _read(**fields) -> pb.ReadGroupsRequest:
    return pb.ReadGroupsRequest(
        **{"job_id": "job", "stream": "s", "consumer_group": "g", "consumer": "c", "max_groups": 1, **fields}
    )


def _ack(**fields) -> pb.AckGroupsRequest:
    return pb.AckGroupsRequest(**{"job_id": "job", "stream": "s", "consumer_group": "g", **fields})


def _append(**fields) -> pb.AppendGroupsRequest:
    group = Group("g1", 1, {"x": np.arange(2)}).to_proto()
    return pb.AppendGroupsRequest(**{"job_id": "job", "stream": "s", "groups": [group], **fields})


def _stream(key: keys_pb2.BatchKey, cut: int = 0) -> list[pb.PutBatchRequest]:
    small = _small(key, cut)
    return [pb.PutBatchRequest(start=small.start), pb.PutBatchRequest(payload=small.payload)]


CASES = [
    ("PutBatch", _stream(_key(job="a/b")), BAD, r"^start.key.job_id = 'a/b'"),
    ("PutBatch", _stream(_key(), cut=5), BAD, r"^payload: the stream ended"),
    ("PutBatch", _stream(_key(node="kept")), grpc.StatusCode.ALREADY_EXISTS, r"already exists"),
    ("PutSmallBatch", _small(_key(job="job!")), BAD, r"^start.key.job_id = 'job!'"),
    ("PutSmallBatch", _small(_key(step=-2)), BAD, r"^start.key.step = -2"),
    ("PutSmallBatch", _small(_key(), ttl_seconds=-5), BAD, r"^start.ttl_seconds = -5"),
    ("PutSmallBatch", _small(_key(), cut=3), BAD, r"payload"),
    ("PutSmallBatch", _small(_key(node="kept")), grpc.StatusCode.ALREADY_EXISTS, r"already exists"),
    ("DeleteBatch", pb.DeleteBatchRequest(key=_key(job="*")), BAD, r"^key.job_id = '\*'"),
    ("DeleteBatch", pb.DeleteBatchRequest(key=_key(step=-1)), BAD, r"^key.step = -1"),
    ("DeleteBatch", pb.DeleteBatchRequest(), BAD, r"^key.job_id = ''"),
    ("DeleteStep", pb.DeleteStepRequest(job_id="job", step=-1), BAD, r"^step = -1"),
    ("DeleteStep", pb.DeleteStepRequest(job_id="*", step=0), BAD, r"^job_id = '\*'"),
    ("DeleteJob", pb.DeleteJobRequest(job_id="*"), BAD, r"^job_id = '\*'"),
    ("DeleteJob", pb.DeleteJobRequest(job_id=""), BAD, r"^job_id = ''"),
    ("DeleteJob", pb.DeleteJobRequest(job_id="../job"), BAD, r"^job_id = '../job'"),
    ("AppendGroups", _append(stream="s*"), BAD, r"^stream = 's\*'"),
    ("AppendGroups", _append(job_id=""), BAD, r"^job_id = ''"),
    ("ReadGroups", _read(consumer=""), BAD, r"^consumer = ''"),
    ("ReadGroups", _read(max_groups=-1), BAD, r"^max_groups = -1"),
    ("ReadGroups", _read(block_seconds=-1.0), BAD, r"^block_seconds = -1.0"),
    ("ReadGroups", _read(block_seconds=float("nan")), BAD, r"^block_seconds = nan"),
    ("ReadGroups", _read(claim_idle_seconds=float("nan")), BAD, r"claim_idle_seconds"),
    ("ReadGroups", _read(min_weight_version=-3), BAD, r"min_weight_version"),
    ("AckGroups", _ack(consumer_group=""), BAD, r"^consumer_group = ''"),
    ("AckGroups", _ack(entry_ids=["not-an-id"]), BAD, r"^entry_ids\[0\]"),
]


@pytest.fixture(scope="module")
def served():
    prefix = unique_prefix("refused")
    raw = redis.Redis.from_url(SYSTEM_REDIS)
    with serving(config(SYSTEM_REDIS, prefix)) as (buffer, running):
        client = DataBufferClient(running.address)
        client.put(batch_key("job", 0, "kept"), {"x": np.arange(6, dtype=np.float32)})
        client.append_groups("job", "s", [Group("g0", 1, {"x": np.arange(2)}), Group("g1", 1, {"x": np.arange(2)})])
        client.read_groups("job", "s", "g", "c", max_groups=1)  # one delivered, not acked: pending
        channel = grpc.insecure_channel(running.address)
        yield channel, lambda: snapshot(raw, buffer.keys.prefix)
        channel.close()
        client.close()
    delete_prefix(raw, prefix)


@pytest.mark.parametrize(
    ("method", "request_", "code", "match"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_a_refused_mutating_call_gets_its_code_and_changes_nothing(served, method, request_, code, match):
    channel, state = served
    before = state()
    assert before, "the store holds a batch and a stream with a pending group before each case"
    with pytest.raises(grpc.RpcError) as info:
        if method == "PutBatch":  # a client stream: start, then the payload
            channel.stream_unary(f"/{SERVICE}/{method}")((m.SerializeToString() for m in request_), timeout=10)
        else:
            channel.unary_unary(f"/{SERVICE}/{method}")(request_.SerializeToString(), timeout=10)
    assert info.value.code() == code, (method, info.value.code(), info.value.details())
    assert re.search(match, info.value.details()), info.value.details()
    assert state() == before
