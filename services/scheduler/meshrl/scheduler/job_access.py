"""Who may act on which job through the scheduler's job API: each call's caller is an identity (a named
submitter token, a client certificate, the scheduler's own token), each job records its submitter's identity in
its run folder, and only that identity or an admin (`job_access.admins`) may watch, get, cancel, scale or
resume it; anyone else is refused with PERMISSION_DENIED.

Built from `SchedulerServiceConfig.job_access` by `python -m meshrl.scheduler`; `SchedulerServicer` resolves
each call's `Caller`, `JobManager` checks it against the job's owner.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.errors import ConfigError, PermissionDenied
from meshrl.common.security import AUTH_HEADER

OPERATOR = "operator"  # whoever presents the scheduler's own token (server.auth)
ANONYMOUS = "anonymous"  # a call that presents nothing: only on a scheduler without authentication
CERT_PREFIX = "cert:"  # a client certificate's identity: cert:<its common name>
OWNER_FILE = "submitter"  # in the run folder: the identity that submitted the run
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


class SubmitterToken(StrictModel):
    """Where one submitter's token is read: a file or an environment variable (exactly one)."""

    token_file: str | None = pydantic.Field(None, description="file holding this submitter's token")
    token_env: str | None = pydantic.Field(None, description="environment variable holding this submitter's token")

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> SubmitterToken:
        if (self.token_file is None) == (self.token_env is None):
            raise ValueError("give exactly one of token_file and token_env for each submitter")
        return self

    def read(self, field: str) -> str:
        if self.token_file is not None:
            path = Path(self.token_file)
            if not path.is_file():
                raise ConfigError(
                    f"{field}.token_file",
                    self.token_file,
                    "the file does not exist",
                    "mount the submitter's token there",
                )
            token = path.read_text().strip()
        else:
            token = os.environ.get(self.token_env or "", "").strip()
        if not token:
            source = self.token_file or f"${self.token_env}"
            raise ConfigError(field, source, "the token is empty or unset", "give the submitter a non-empty token")
        return token


class JobAccess(StrictModel):
    """The scheduler's identities: named submitter tokens beside its own, and who may act on every job."""

    submitters: dict[str, SubmitterToken] = pydantic.Field(
        default_factory=dict,
        description="one token per submitter, by name: a call with it acts as that name and may act only on "
        "the jobs it submitted (client certificates act as cert:<common name>; the scheduler's own server.auth "
        "token as 'operator')",
    )
    admins: list[str] = pydantic.Field(
        default_factory=lambda: [OPERATOR],
        description="identities that may act on every job (names, cert:<common name>, operator)",
    )

    @pydantic.field_validator("submitters")
    @classmethod
    def _names(cls, value: dict[str, SubmitterToken]) -> dict[str, SubmitterToken]:
        for name in value:
            if not _NAME.fullmatch(name) or name in (OPERATOR, ANONYMOUS):
                raise ValueError(
                    f"submitter name {name!r} must be 1-64 letters, digits or ._@- (not starting with one of "
                    f"._@-) and not {OPERATOR!r} or {ANONYMOUS!r}; choose another name"
                )
        return value

    def tokens(self) -> dict[str, str]:
        """Each submitter's token by name; two submitters may not share one."""
        tokens = {name: source.read(f"job_access.submitters.{name}") for name, source in self.submitters.items()}
        seen: dict[str, str] = {}
        for name, token in tokens.items():
            if token in seen:
                raise ConfigError(
                    f"job_access.submitters.{name}",
                    "(a token)",
                    f"it is the same token as submitter {seen[token]!r}",
                    "give every submitter a token of its own",
                )
            seen[token] = name
        return tokens

    def callers(self, server_token: str | None, client_certificates: bool) -> Callers:
        """How the scheduler's server names its callers; `client_certificates`: its TLS requires them."""
        tokens = self.tokens()
        if server_token is not None and server_token in tokens.values():
            raise ConfigError(
                "job_access.submitters",
                "(a token)",
                "a submitter's token is server.auth's token",
                "give submitters tokens other than the scheduler's own",
            )
        return Callers(tokens, frozenset(self.admins), server_token, client_certificates)


@dataclass(frozen=True)
class Caller:
    """The identity behind one call; `admin`: may act on every job."""

    identity: str
    admin: bool = False

    def check(self, owner: str, action: str, what: str) -> None:
        """Refuses (PERMISSION_DENIED) unless this caller submitted `what` (owner) or is an admin."""
        if self.admin or (owner and owner == self.identity):
            return
        by = f"submitted by {owner!r}" if owner else "of an unrecorded submitter"
        raise PermissionDenied(
            f"{self.identity!r} may not {action} {what}: it is {by}, and only its submitter or an admin may. "
            "Fix: act on your own jobs, or ask the operator to add your identity to the scheduler's "
            "job_access.admins"
        )


LOCAL = Caller(OPERATOR, admin=True)  # `meshrl run` and in-process callers: the operator's own process


class Callers:
    """Names the caller of each job-API call: a submitter's token, else a client certificate, else the
    scheduler's own token (the operator); on a scheduler without authentication every caller is anonymous
    and, as nothing tells callers apart, may act on every job."""

    def __init__(
        self,
        tokens: Mapping[str, str] | None = None,
        admins: frozenset[str] = frozenset({OPERATOR}),
        server_token: str | None = None,
        client_certificates: bool = False,
    ) -> None:
        self._bearers = [(f"Bearer {t}".encode(), name) for name, t in (tokens or {}).items()]
        self._server = f"Bearer {server_token}".encode() if server_token else None
        self.admins = admins
        self.open = not self._bearers and self._server is None and not client_certificates

    def caller(self, identity: str) -> Caller:
        return Caller(identity, admin=identity in self.admins)

    def of(self, context) -> Caller:
        """The caller of the call whose gRPC server context is `context`."""
        if self.open:
            return Caller(ANONYMOUS, admin=True)
        presented = dict(context.invocation_metadata() or ()).get(AUTH_HEADER, "").encode()
        for bearer, name in self._bearers:
            if hmac.compare_digest(presented, bearer):
                return self.caller(name)
        common_names = (context.auth_context() or {}).get("x509_common_name") or []
        if common_names:
            return self.caller(CERT_PREFIX + common_names[0].decode(errors="replace"))
        if self._server is not None and hmac.compare_digest(presented, self._server):
            return self.caller(OPERATOR)
        return Caller(ANONYMOUS)  # no credentials on a secured scheduler (its interceptor refuses such calls)


def check_folder(folder: Path, run_root: Path, caller: Caller) -> None:
    """Refuses (PERMISSION_DENIED) a new run in `folder` when it is, or lies inside, the run folder of another
    submitter (an ended job's folder that a job id or job.run_root names again)."""
    folder, root = Path(folder).resolve(), Path(run_root).resolve()
    below = [folder, *folder.parents] if folder.is_relative_to(root) else [folder]
    for path in below:
        owner = recorded_owner(path)
        if owner:
            caller.check(owner, "write into", f"the run folder {str(path)!r}")
        if path == root:
            return


def record_owner(folder: Path, identity: str) -> None:
    """Writes the submitter's identity into a new run folder."""
    (Path(folder) / OWNER_FILE).write_text(identity + "\n")


def recorded_owner(folder: Path) -> str:
    """The identity that submitted the run in `folder`; "" when none was recorded (only admins may resume it)."""
    path = Path(folder) / OWNER_FILE
    return path.read_text().strip() if path.is_file() else ""
