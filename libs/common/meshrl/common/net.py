"""Small network helpers every service and test shares: a free TCP port on an address.

Used by launchers that pick ports for rendezvous (trainer ranks, the weight-update group), by the rollout's
HTTP engine servers and by tests.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1", also_free: int = 0) -> int:
    """A TCP port that is free on `host` now. With `also_free`, port + also_free must be free too (a Redis
    Cluster node's bus port). The port may be taken by someone else before it is bound again; callers that
    race bind with retries."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if not also_free:
            return port
        if port + also_free > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port + also_free))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port found on {host}")
