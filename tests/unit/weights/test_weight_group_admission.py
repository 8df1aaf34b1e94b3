"""A weight group's rendezvous keeps strangers out where the transport allows it: rank 0 hosts the store on
the group's address only (a secured group refuses an address that is not its host's; the engines' groups too),
the values the gloo / NCCL backend leaves in the store (NCCL's unique id, gloo's addresses) are sealed with the
service token (unreadable, and a forged or moved one refused), and a member faced with a trainer that cannot
prove the token refuses to join before any backend is made."""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import replace
from datetime import timedelta

import pytest
import torch.distributed as dist

from meshrl.common.errors import PermissionDenied
from meshrl.common.net import free_port
from meshrl.common.weights import GroupPlan, WeightGroup, WeightGroupOptions
from meshrl.common.weights.engine_group import EngineGroupSender
from meshrl.common.weights.rendezvous import STORE_PREFIX
from meshrl.common.weights.sealed_store import SealedStore, StoreTampered
from meshrl.common.weights.store_host import _bind, host_store

SECRET = "the-service-token"


def _reaches(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
        return True
    except OSError:
        return False


def test_the_store_listens_only_on_the_group_address():
    port = free_port()
    store = host_store("127.0.0.2", port, None, 10.0, strict=True)
    store.set("k", "v")
    client = dist.TCPStore("127.0.0.2", port, None, False, timedelta(seconds=10))
    assert client.get("k") == b"v"
    assert not _reaches("127.0.0.3", port)  # another address of the same host: nothing listens there
    assert not _reaches("127.0.0.1", port)


def test_a_secured_store_refuses_an_address_that_is_not_its_hosts(caplog):
    with pytest.raises(OSError, match="weights.group_address"):
        host_store("192.0.2.1", free_port(), None, 10.0, strict=True)
    with caplog.at_level(logging.WARNING, logger="meshrl.common.weights.store_host"):
        assert _bind("192.0.2.1", free_port(), strict=False) is None  # unsecured: every interface, said
    assert "listens on every interface" in caplog.text and "weights.group_address" in caplog.text


def test_a_taken_port_is_refused():
    port = free_port()
    first = host_store("127.0.0.2", port, None, 10.0, strict=True)
    with pytest.raises(OSError) as info:
        host_store("127.0.0.2", port, None, 10.0, strict=True)
    assert "weights.group_address" not in str(info.value)  # the port, not the address
    del first


def test_the_engines_group_store_listens_only_on_its_address():
    spec = replace(GroupPlan.build([("r", 1)], "127.0.0.2", free_port(), "e", "gloo", 10.0).sender, protocol="engine")
    port = spec.master_port
    ready = threading.Event()

    def engine_rank() -> None:  # an engine's worker as rank 1, through the same store address
        from meshrl.common.weights.engine_group import engine_process_group

        store = dist.TCPStore("127.0.0.2", port, 2, False, timedelta(seconds=10))
        engine_process_group("gloo", store, 1, 2, "e", 10.0)
        ready.set()

    worker = threading.Thread(target=engine_rank)
    worker.start()
    sender = EngineGroupSender.join(spec)
    worker.join(30)
    assert ready.is_set()
    assert not _reaches("127.0.0.3", port)
    sender.destroy()


def test_sealed_values_are_unreadable_and_forged_or_moved_ones_refused():
    port = free_port()
    inner = dist.TCPStore("127.0.0.2", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    sealed = SealedStore(inner, SECRET, "g")
    unique_id = bytes(range(128))  # what NCCL's rank 0 leaves for the others
    sealed.set("0", unique_id)
    assert sealed.get("0") == unique_id
    assert unique_id not in inner.get("0") and unique_id[:16] not in inner.get("0")  # a stranger reads noise
    assert sealed.add("n", 2) == 2 and sealed.check(["0", "n"])
    inner.set("1", unique_id)  # a stranger's own value
    with pytest.raises(StoreTampered, match="not sealed with this member's service token"):
        sealed.get("1")
    inner.set("2", inner.get("0"))  # a sealed value moved to another key
    with pytest.raises(StoreTampered):
        sealed.get("2")
    with pytest.raises(StoreTampered):
        SealedStore(inner, "another token", "g").get("0")
    with pytest.raises(StoreTampered):
        SealedStore(inner, SECRET, "another group").get("0")


def test_a_member_refuses_a_trainer_that_cannot_prove_the_token():
    plan = GroupPlan.build([("r", 1)], "127.0.0.2", free_port(), "t", "gloo", 10.0)
    rogue = dist.TCPStore(
        "127.0.0.2", plan.sender.master_port, None, True, timedelta(seconds=30), wait_for_workers=False
    )  # a stranger hosting the group's store
    group = dist.PrefixStore(f"{STORE_PREFIX}t/", rogue)
    group.set("admit/challenge", b"c" * 32)
    group.set("joined/0", b"1")
    group.set("admit/verdict", b"ok")  # it cannot compute the token's HMAC over the challenge
    options = WeightGroupOptions(local_address="127.0.0.3", secret=SECRET, init_timeout_s=10.0)
    with pytest.raises(PermissionDenied, match="rank 1 and the trainer do not share the service token.*no proof"):
        WeightGroup.join(plan.replica_spec("r"), options=options)
    assert not group.check(["pg/cpu/0"]) and not any(group.check([f"pg/{k}"]) for k in ("0", "1"))
