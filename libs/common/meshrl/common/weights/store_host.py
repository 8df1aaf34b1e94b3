"""Hosting a weight group's TCPStore on one address. torch's TCPStore server listens on every interface of
the trainer's host, so anyone who reaches the port on any of them could read and write the group's keys;
here rank 0 binds the listening socket itself, on the group's address, and hands it to the store
(`master_listen_fd`). An address that is not this host's (NAT, a service name) falls back to every interface
with a warning, unless `strict` (a secured group: a service token is set), which refuses it instead.

Used by `rendezvous.py` (meshrl's protocol) and `engine_group.py` (the engines' protocol).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from datetime import timedelta

import torch.distributed as dist

log = logging.getLogger(__name__)
BACKLOG = 128


def host_store(
    address: str, port: int, world_size: int | None, timeout_s: float, *, strict: bool, multi_tenant: bool = False
) -> dist.TCPStore:
    """Rank 0's store, listening on `address:port` only (see the module's docstring). Raises OSError when
    the port is taken, or when `strict` and `address` is not one of this host's."""
    listener = _bind(address, port, strict)
    options = {"wait_for_workers": False, "multi_tenant": multi_tenant}
    timeout = timedelta(seconds=timeout_s)
    if listener is None:
        return dist.TCPStore(address, port, world_size, True, timeout, **options)
    fd = listener.detach()  # the store owns the socket from here on
    try:
        return dist.TCPStore(address, port, world_size, True, timeout, master_listen_fd=fd, **options)
    except BaseException:
        os.close(fd)
        raise


def _bind(address: str, port: int, strict: bool) -> socket.socket | None:
    """A socket listening on `address:port`; None (every interface) when `address` is not this host's and
    not `strict`."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own server does
        sock.bind((address, port))
        sock.listen(BACKLOG)
        return sock
    except OSError as e:
        sock.close()
        if e.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) and not isinstance(e, socket.gaierror):
            raise  # the port is taken: the caller says so
        if strict:
            raise OSError(
                f"cannot bind the weight group's store to {address} ({e}); a secured weight group listens only "
                "there: set weights.group_address to an address of the trainer's host"
            ) from e
        log.warning(
            "the weight group's store listens on every interface: %s is not an address of this host (%s); set "
            "weights.group_address to one of its addresses to keep the store off the others",
            address,
            e,
        )
        return None
