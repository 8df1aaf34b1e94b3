"""An engine-protocol weight group with a service token: the trainer's bucket specs and the replicas'
confirmations carry the token's HMAC, so an update goes through as before, a spec a stranger wrote into the
store fails the replica's update (no tensors of its shapes are received), and a confirmation a stranger
appended is not counted (the trainer waits for the real one)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from meshrl.common.errors import DataLoss, FailedPrecondition, InvalidArgument
from meshrl.common.net import free_port
from meshrl.common.weight_group_secret import mac, set_group_secret
from meshrl.common.weights import GroupSpec, dtypes
from meshrl.common.weights.engine_group import (
    EngineGroupReader,
    EngineGroupSender,
    _confirmations,
    _key,
    broadcast_all,
    engine_process_group,
    sealed_for,
)
from meshrl.common.weights.errors import MembersUnresponsive
from meshrl.common.weights.transport import Deadline

SECRET = "the-service-token"


@pytest.fixture(autouse=True)
def secured():
    set_group_secret(SECRET)
    yield
    set_group_secret(None)


def _spec(name: str, timeout_s: float = 30.0, rank_offset: int = 0) -> GroupSpec:
    return GroupSpec("127.0.0.2", free_port(), 2, rank_offset, name, "gloo", timeout_s, "engine")


def _engine_rank(spec: GroupSpec, version: int, confirm: bool, got: dict) -> None:
    """A replica: its engine's worker as rank 1 and its adapter reading the specs (confirming when told)."""
    store = dist.TCPStore(spec.master_address, spec.master_port, 2, False, timedelta(seconds=30))
    pg = engine_process_group("gloo", store, 1, 2, spec.group_name, spec.timeout_s)
    reader = EngineGroupReader(GroupSpec(**{**spec.__dict__, "rank_offset": 1}), ranks=1)
    try:
        for meta in reader.buckets(version, 30.0):
            into = [torch.zeros(list(t.shape), dtype=dtypes.from_proto(t.dtype)) for t in meta.tensors]
            broadcast_all(pg, into, Deadline(30.0, "test bucket"))
            got.update((t.name, x) for t, x in zip(meta.tensors, into, strict=True))
        if confirm:
            reader.confirm(None)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        got["error"] = exc


def _run(spec: GroupSpec, tensors: dict, confirm: bool = True):
    got: dict = {}
    worker = threading.Thread(target=_engine_rank, args=(spec, 1, confirm, got))
    worker.start()
    sender = EngineGroupSender.join(spec)
    try:
        return sender, sender.send(list(tensors.items()), 1), got
    finally:
        worker.join(60)


def test_a_signed_update_goes_through():
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4)}
    sender, outcome, got = _run(_spec("signed"), tensors)
    assert outcome.acked == (1,) and "error" not in got
    assert all(torch.equal(got[n], t) for n, t in tensors.items())
    spec_key = _key("signed", 1, "bucket/0")
    stored = sender.store.get(spec_key)
    assert stored[-32:] == mac(SECRET, spec_key, stored[:-32])  # the spec carries the token's HMAC
    sender.destroy()


def test_a_spec_a_stranger_wrote_fails_the_replicas_update():
    spec = _spec("forged-spec")
    host = dist.TCPStore(
        spec.master_address, spec.master_port, None, True, timedelta(seconds=30), wait_for_workers=False
    )
    host.set(_key("forged-spec", 1, "bucket/0"), b"\x08\x01")  # version 1, no signature
    reader = EngineGroupReader(GroupSpec(**{**spec.__dict__, "rank_offset": 1}), ranks=1)
    with pytest.raises(DataLoss, match="not signed with the service token"):
        next(reader.buckets(1, 10.0))


def test_a_confirmation_a_stranger_appended_is_not_counted():
    spec = _spec("forged-ack", timeout_s=2.0)
    got: dict = {}
    worker = threading.Thread(target=_engine_rank, args=(spec, 1, False, got))  # receives, never confirms
    worker.start()
    sender = EngineGroupSender.join(spec)
    key = _key("forged-ack", 1, "confirmations")
    sender.store.append(key, f"1|1|{b'ok'.hex()}|{'00' * 32}\n")  # a stranger's "rank 1 is done"
    with pytest.raises(MembersUnresponsive, match="0 of 1 engine ranks confirmed"):
        sender.send([("a", torch.ones(3))], 1)
    worker.join(60)
    assert "error" not in got and torch.equal(got["a"], torch.ones(3))
    sender.destroy()


def test_confirmation_lines_count_once_and_only_when_signed():
    key = _key("g", 3, "confirmations")

    def line(offset: int, ranks: int, status: str, secret: str = SECRET) -> str:
        return f"{offset}|{ranks}|{status.encode().hex()}|{mac(secret, key, offset, ranks, status).hex()}"

    text = "\n".join(
        [
            line(1, 2, "ok"),
            line(1, 2, "refused: again"),  # a second line of offset 1: the first counts
            line(3, 1, "refused: bad shape"),
            line(4, 1, "ok", secret="another token"),
            "5|1|zz|00",
            "garbage",
        ]
    )
    assert _confirmations(text, key, SECRET) == {1: (2, "ok"), 3: (1, "refused: bad shape")}
    assert set(_confirmations(text, key, None)) == {1, 3, 4}  # without a token nothing is signed


def test_a_sealed_engine_group_builds_its_backend_over_the_sealed_store():
    """GroupSpec.sealed (every engine rank is meshrl's vLLM worker): the backend's values are sealed; without a
    token the group is refused with the setting to fix; only the engine protocol can ask for it; the flag
    travels in the CollectiveGroup message."""
    store = dist.HashStore()
    assert sealed_for(store, SECRET, "g", sealed=False) is store
    sealed = sealed_for(store, SECRET, "g", sealed=True)
    sealed.set("addr", b"127.0.0.1:5000")
    assert sealed.get("addr") == b"127.0.0.1:5000" and b"127.0.0.1" not in store.get("addr")
    with pytest.raises(FailedPrecondition, match="holds no service token.*server.auth"):
        sealed_for(store, None, "g", sealed=True)
    with pytest.raises(InvalidArgument, match="sealed applies to protocol engine"):
        GroupSpec("127.0.0.1", 5000, 2, 0, "g", "gloo", 10.0, "meshrl", sealed=True)
    spec = GroupSpec("127.0.0.1", 5000, 2, 1, "g", "gloo", 10.0, "engine", sealed=True)
    assert GroupSpec.from_proto(spec.to_proto()) == spec
