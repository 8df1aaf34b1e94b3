"""A replica behind a real Rollout gRPC server, for the rollout tests that call the service over the wire."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from meshrl.api.rollout.v1 import rollout_pb2_grpc
from meshrl.common.grpc_channel import open_channel
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.server import service


@contextlib.contextmanager
def serve_replica(replica: RolloutReplica) -> Iterator[rollout_pb2_grpc.RolloutStub]:
    """The replica marked serving behind a real Rollout gRPC server on a free port; a stub to it."""
    replica.mark_serving()
    running = start_server(ServerConfig(port=0), [service(replica)])
    channel = open_channel(running.address)
    try:
        yield rollout_pb2_grpc.RolloutStub(channel)
    finally:
        channel.close()
        running.stop(0)
