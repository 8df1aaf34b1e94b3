"""`meshrl.trainer.spawn` and `dp.rank_zero_store`: rank 0's store binds its own port (no race between choosing
and binding), a rank started before that port exists reads it from stdin, and a rank whose rank 0 stopped first
(stdin closed) or that died before being told fails with a message saying so."""

from __future__ import annotations

import io
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from meshrl.common.errors import ConfigError, Unavailable
from meshrl.trainer.dp import rank_zero_store
from meshrl.trainer.spawn import SpawnedRanks, read_port

READER = "from meshrl.trainer.spawn import read_port; print(read_port() + 1)"


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False)


def test_read_port_reads_a_line_and_refuses_a_closed_stdin():
    assert read_port(io.StringIO("4321\n")) == 4321
    with pytest.raises(Unavailable, match="rank 0 stopped"):
        read_port(io.StringIO(""))


def test_ranks_started_first_learn_the_port_later():
    spawned = SpawnedRanks([_child(READER), _child(READER)])
    spawned.tell_port(4321)
    spawned.reap(grace=60)
    assert [p.stdout.read().strip() for p in spawned.procs] == [b"4322", b"4322"]
    assert [p.returncode for p in spawned.procs] == [0, 0]


def test_reap_closes_stdin_of_a_rank_still_waiting_for_the_port():
    spawned = SpawnedRanks([_child(READER)])
    spawned.reap(grace=60)  # rank 0 failed before binding: the rank reads EOF and exits with Unavailable
    assert spawned.procs[0].returncode == 1


def test_tell_port_names_a_rank_that_died():
    dead = _child("raise SystemExit(3)")
    dead.wait(60)
    with pytest.raises(Unavailable, match=r"rank 1 .* exited during start-up \(code 3\)"):
        SpawnedRanks([dead]).tell_port(4321)


def test_rank_zero_store_binds_a_free_port_itself_and_others_connect():
    store = rank_zero_store("127.0.0.1", 0, 2, timeout_s=30)
    assert store.port > 0
    client = dist.TCPStore("127.0.0.1", store.port, 2, is_master=False)
    client.set("k", "v")
    assert store.get("k") == b"v"


def test_rank_zero_store_refuses_a_taken_port_with_the_field_to_change():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="data_parallel.master_port"):
            rank_zero_store("127.0.0.1", taken.getsockname()[1], 2, timeout_s=5)
