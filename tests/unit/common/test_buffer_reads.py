"""How DataBufferClient.get_many reads (a served data buffer over the machine's Redis, unique prefix): a node's
one upstream batch is read in the calling thread, with no hand-off to a pool thread and back (the trainer's
log-prob passes and the reward node read one batch each step); several large ones are still read in parallel."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.databuffer_client import DataBufferClient
from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, serving, unique_prefix


@pytest.fixture(scope="module")
def client():
    prefix = unique_prefix("reads")
    with serving(config(SYSTEM_REDIS, prefix)) as (_, running):
        c = DataBufferClient(running.address, frame_bytes=4096)
        yield c
        c.close()
    delete_prefix(redis.Redis.from_url(SYSTEM_REDIS), prefix)


def spy_threads(client, monkeypatch) -> list[int]:
    threads: list[int] = []
    real = client.get

    def get(key, **kwargs):
        threads.append(threading.get_ident())
        return real(key, **kwargs)

    monkeypatch.setattr(client, "get", get)
    return threads


def test_one_upstream_batch_is_read_in_the_calling_thread(client, monkeypatch):
    key = batch_key("job-r", 1, "rollout")
    client.put(key, {S.RESPONSE_IDS: Ragged.from_rows([[1, 2], [3]], dtype=np.int32)})
    threads = spy_threads(client, monkeypatch)
    batch = client.get_many([key], columns=[S.RESPONSE_IDS])
    assert batch[S.RESPONSE_IDS].values.tolist() == [1, 2, 3]
    assert threads == [threading.get_ident()]


def test_several_large_batches_are_still_read_apart(client, monkeypatch):
    keys = [batch_key("job-r", 2, f"node{i}") for i in range(2)]
    for i, key in enumerate(keys):  # beyond one 4 KiB frame each: not in the GetSmallBatches call
        client.put(key, {f"c{i}": np.full(4096, i, dtype=np.int32)})
    threads = spy_threads(client, monkeypatch)
    batch = client.get_many(keys)
    assert batch["c0"].sum() == 0 and batch["c1"].sum() == 4096
    assert len(threads) == 2 and threading.get_ident() not in threads
