"""The trainer group's client: an internal error while a rank is gone becomes Unavailable (the job restarts its
services); with every rank alive, and for other errors, the error stays what it was."""

from __future__ import annotations

import pytest

from meshrl.common.errors import Internal, InvalidArgument, Unavailable
from meshrl.scheduler.launch.group_client import GroupTrainerClient
from meshrl.scheduler.recovery import restartable


class FakeClient:
    timeout = 60.0

    def __init__(self, error: Exception | None) -> None:
        self.error, self.closed = error, False

    def status(self) -> str:
        if self.error is not None:
            raise self.error
        return "ok"

    def close(self) -> None:
        self.closed = True


class FakeGroup:
    def __init__(self, lost: str | None) -> None:
        self.lost, self.asked = lost, []

    def lost_rank(self, timeout: float) -> str | None:
        self.asked.append(timeout)
        return self.lost


def test_an_internal_error_with_a_rank_gone_is_unavailable_naming_it():
    gloo = Internal("internal error in /meshrl.trainer.v1.Trainer/TrainStep: RuntimeError: Connection reset by peer")
    group = FakeGroup("rank 1 on 127.0.0.3 has ended")
    client = GroupTrainerClient(FakeClient(gloo), group, probe_seconds=3.0)
    with pytest.raises(Unavailable, match="trainer rank 1 on 127.0.0.3 has ended; the call failed with: internal") as e:
        client.status()
    assert restartable(e.value) and not restartable(gloo) and group.asked == [3.0]


def test_with_every_rank_alive_an_internal_error_stays_internal():
    client = GroupTrainerClient(FakeClient(Internal("a bug")), FakeGroup(None))
    with pytest.raises(Internal, match="a bug"):
        client.status()


def test_other_errors_and_attributes_pass_through_unchecked():
    group = FakeGroup("rank 1 has ended")
    inner = FakeClient(InvalidArgument("bad role"))
    client = GroupTrainerClient(inner, group)
    with pytest.raises(InvalidArgument, match="bad role"):
        client.status()
    assert group.asked == [] and client.timeout == 60.0
    client.close()
    assert inner.closed
    assert GroupTrainerClient(FakeClient(None), group).status() == "ok"
