"""The weight-group secret of this process: the service token that the members of a weight group prove to each
other (an HMAC over a fresh challenge) before a weight byte moves on the CPU stream, and that signs what the
sender and receivers leave in the group's store (headers, acknowledgements).

`meshrl.common.service_main.run_service` sets it from `server.auth` (so a trainer and its replicas must share
one token); `meshrl.common.weights.WeightGroupOptions.secret` defaults to it. Torch-free: every service sets it.
A vLLM server that a replica launches gets it in its environment (SECRET_ENV), so that meshrl's worker extension
inside it can seal its weight group (engine_group.sealed_for); set it there yourself for a server you start.
"""

from __future__ import annotations

import hashlib
import hmac

SECRET_ENV = "MESHRL_WEIGHT_GROUP_SECRET"
_secret: str | None = None


def set_group_secret(token: str | None) -> None:
    global _secret
    _secret = token or None


def group_secret() -> str | None:
    return _secret


def mac(secret: str | bytes, *parts: str | bytes | int) -> bytes:
    """HMAC-SHA256 of `secret` over the parts (length-prefixed, so no two part lists collide)."""
    key = secret.encode() if isinstance(secret, str) else secret
    message = b"".join(
        len(b := (p if isinstance(p, bytes) else str(p).encode())).to_bytes(4, "little") + b for p in parts
    )
    return hmac.new(key, message, hashlib.sha256).digest()
