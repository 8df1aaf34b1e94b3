"""The containers' HEALTHCHECK: asks a meshrl server's grpc.health.v1.Health service whether it is SERVING.

Copied into every image as /opt/meshrl/bin/grpc_healthcheck.py and run by Docker as
`python /opt/meshrl/bin/grpc_healthcheck.py 127.0.0.1:<health port>`; exit 0 = healthy,
1 = not serving or unreachable (Docker's contract). It talks plaintext to the health-only
port (`server.health_port`), so it needs neither the TLS certificates nor the auth token.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout: float = 3.0) -> tuple[bool, str]:
    """Returns (serving, what was seen) for one Health/Check call."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            return False, f"{address}: {exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port of the health endpoint, e.g. 127.0.0.1:50061")
    parser.add_argument("--service", default="", help='service name to ask about ("" = the whole server)')
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    serving, seen = check(args.address, args.service, args.timeout)
    print(seen)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
