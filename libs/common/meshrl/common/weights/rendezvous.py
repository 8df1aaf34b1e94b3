"""The weight group's side channel: the trainer's TCPStore and the keys members leave in it.

Used by `collective.py`. Everything a member must tell the others outside the broadcasts goes
through here, under `meshrl/weights/<group>/`:
  joined/<rank>              the member is in (everyone waits for all before the backend starts)
  update/<seq>               the sender starts update number <seq>: the header of its bucket 0 (or
                             its abort or failure marker), which carries the version
  bucket/<seq>/<i>           header and WeightBucketMeta of the update's bucket i > 0, or its end,
                             abort or failure marker (wire.py); set before that bucket's broadcast
  progress/<seq>/<rank>      the last bucket this receiver got
  failed/<seq>/<rank>        this receiver is alive but lost the update (timed out, sender gone)
  ack/<seq>/<rank>           "ok" or "refused: <error>" once its sink finished
  alive/<rank>               a counter the receiver's heartbeat thread advances a few times a second
  closed                     the sender is leaving: heartbeats stop before its store goes away
  left/<rank>                this receiver's heartbeat stopped (the sender waits briefly for these)
so after a failed step the sender can name the members that stopped instead of guessing, and no
receiver writes to a store that is gone (torch prints a "Broken pipe" trace for that).
  admit/challenge            rank 0's fresh challenge; with a service token each member's joined/<rank> is
                             its HMAC over it (a member without the token is named at once, before any
                             backend is made)
  pg/...                     the keys of the group's gloo / NCCL backend (sealed with the token: sealed_store.py)
A finished update's keys are deleted in the background, on a connection of their own.
Rank 0 hosts the store on the group's address only (store_host.py).
With a service token (`secret`) the headers and acknowledgements carry an HMAC of it over their key and
value: the store has no authentication, and a stranger who reaches it must not make receivers allocate what
a forged header says or the sender believe a forged acknowledgement.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch.distributed as dist

from meshrl.common.errors import DataLoss, DeadlineExceeded, PermissionDenied, Unavailable
from meshrl.common.weight_group_secret import mac

from .errors import MembersUnresponsive, UpdateOutcome
from .group_plan import GroupSpec
from .sealed_store import SealedStore
from .store_host import host_store
from .transport import CollectiveFailed, Deadline, await_keys, await_values

log = logging.getLogger(__name__)
STORE_PREFIX = "meshrl/weights/"
HEARTBEAT_S = 0.25
LEAVE_CHECK_S = 0.05  # how often a heartbeat looks for the sender's "closed"


class Rendezvous:
    """One member's connection to its group's store (rank 0 hosts it)."""

    def __init__(self, spec: GroupSpec, rank: int, deadline: Deadline, secret: str | None = None) -> None:
        self.spec = spec
        self.rank = rank
        self.secret = secret
        self._challenge = b""  # rank 0's admission challenge (with a service token)
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        self._janitor: ThreadPoolExecutor | None = None
        self._janitor_store: dist.PrefixStore | None = None
        self.store = self._connect(rank == 0, deadline.seconds)

    def _connect(self, host: bool, timeout_s: float) -> dist.PrefixStore:
        s = self.spec
        try:
            if host:
                tcp = host_store(s.master_address, s.master_port, None, timeout_s, strict=bool(self.secret))
            else:
                tcp = dist.TCPStore(s.master_address, s.master_port, None, False, timedelta(seconds=timeout_s))
        except Exception as e:
            where = f"{s.master_address}:{s.master_port}"
            if host:
                raise Unavailable(
                    f"cannot host weight group {s.group_name!r}'s store on {where} ({e}); use a free port"
                ) from e
            raise DeadlineExceeded(f"rank {self.rank} could not reach the trainer's store at {where} ({e})") from e
        return dist.PrefixStore(f"{STORE_PREFIX}{s.group_name}/", tcp)

    def backend_store(self) -> dist.Store:
        """The store the group's gloo / NCCL backend is built over: sealed with the service token when set."""
        store = dist.PrefixStore("pg/", self.store)
        return SealedStore(store, self.secret, self.spec.group_name) if self.secret else store

    # ------------------------------------------------------------------------ membership
    def join(self, deadline: Deadline) -> None:
        """Announces this rank and waits for every other; raises MembersUnresponsive naming the missing.
        With a service token each member proves it over rank 0's fresh challenge, and rank 0 refuses
        (PermissionDenied, naming the ranks) a group whose members did not prove it."""
        self.store.set(f"joined/{self.rank}", self._admission(deadline))
        keys = [f"joined/{r}" for r in range(self.spec.world_size)]
        missing = await_keys(self.store, keys, deadline)
        if missing:
            ranks = tuple(int(k.split("/")[1]) for k in missing)
            raise MembersUnresponsive(
                f"weight group {self.spec.group_name!r}: ranks {list(ranks)} did not join within {deadline.seconds:.1f}s",
                UpdateOutcome(version=-1, unresponsive=ranks),
            )
        if self.secret:
            self._admit(deadline)

    def _admit(self, deadline: Deadline) -> None:
        """Rank 0 checks every member's proof and posts its verdict (its own proof, or the refused ranks);
        the members wait for it, so each side knows the other holds the token before a backend is made."""
        admitted = mac(self.secret, self.spec.group_name, "admitted", self._challenge)
        fix = "give the trainer and every replica the same server.auth token"
        if self.rank == 0:
            ranks = range(1, self.spec.world_size)
            proofs = zip(ranks, self.store.multi_get([f"joined/{r}" for r in ranks]), strict=True)
            bad = [r for r, p in proofs if not hmac.compare_digest(p, self._proof(r, self._challenge))]
            self.store.set("admit/verdict", f"refused {bad}".encode() if bad else admitted)
            if bad:
                raise PermissionDenied(
                    f"weight group {self.spec.group_name!r}: ranks {bad} did not prove the service token "
                    f"(another token, or not members of this group); {fix}"
                )
            return
        verdict = await_values(self.store, ["admit/verdict"], deadline)[0]
        if verdict is None:
            raise MembersUnresponsive(
                f"weight group {self.spec.group_name!r}: the trainer gave no admission verdict within "
                f"{deadline.seconds:.1f}s",
                UpdateOutcome(version=-1, unresponsive=(0,)),
            )
        if not hmac.compare_digest(verdict, admitted):
            why = verdict.decode(errors="replace")[:80] if verdict.startswith(b"refused") else "no proof"
            raise PermissionDenied(
                f"weight group {self.spec.group_name!r}: rank {self.rank} and the trainer do not share the "
                f"service token (the trainer's verdict: {why}); no weights were received; {fix}"
            )

    def _admission(self, deadline: Deadline) -> bytes:
        """What this rank leaves as joined/<rank>: with a service token, rank 0 posts a fresh challenge and
        every other rank its HMAC over it."""
        if not self.secret:
            return b"1"
        if self.rank == 0:
            self._challenge = os.urandom(32)
            self.store.set("admit/challenge", self._challenge)
            return b"1"
        challenge = self._challenge = await_values(self.store, ["admit/challenge"], deadline)[0] or b""
        if not challenge:
            raise MembersUnresponsive(
                f"weight group {self.spec.group_name!r}: the trainer posted no admission challenge within "
                f"{deadline.seconds:.1f}s",
                UpdateOutcome(version=-1, unresponsive=(0,)),
            )
        return self._proof(self.rank, challenge)

    def _proof(self, rank: int, challenge: bytes) -> bytes:
        return mac(self.secret, self.spec.group_name, "joined", rank, challenge)

    def start_heartbeat(self) -> None:
        self._beater = threading.Thread(target=self._heartbeat, name="weights-heartbeat", daemon=True)
        self._beater.start()

    def _heartbeat(self) -> None:
        """Advances alive/<rank> until close() or until the sender says it is leaving, on a
        connection of its own; then leaves left/<rank>."""
        try:
            store = self._connect(False, 10.0)
            beat, due = 0, 0.0
            while not self._stop.is_set() and not store.check(["closed"]):
                if time.monotonic() >= due:
                    beat += 1
                    store.set(f"alive/{self.rank}", str(beat))
                    due = time.monotonic() + HEARTBEAT_S
                self._stop.wait(LEAVE_CHECK_S)
            store.set(f"left/{self.rank}", "1")
        except Exception:  # the trainer's store went away: the group is gone, nothing left to beat for
            self._stop.set()

    def close(self) -> None:
        if self.rank == 0:
            self._say_goodbye()
        self._stop.set()
        if self._beater is not None:
            self._beater.join(timeout=2 * HEARTBEAT_S)
            self._beater = None
        if self._janitor is not None:
            self._janitor.shutdown(wait=False, cancel_futures=True)
            self._janitor = None

    def _say_goodbye(self) -> None:
        """Sender: tells the receivers' heartbeats to stop and waits (at most two beats) until they
        did, so none writes to the store after it closes."""
        try:
            self.store.set("closed", "1")
            keys = [f"left/{r}" for r in range(1, self.spec.world_size)]
            end = time.monotonic() + 2 * HEARTBEAT_S
            while keys and not all(self.store.check([k]) for k in keys) and time.monotonic() < end:  # one key a check
                time.sleep(0.005)
        except Exception:  # the store itself failed: nothing to wait for
            return

    # ------------------------------------------------------------------------ signed values
    def _seal(self, key: str, value: bytes) -> bytes:
        return value + mac(self.secret, self.spec.group_name, key, value) if self.secret else value

    def _open(self, key: str, value: bytes | None) -> bytes | None:
        """The value the sender or a receiver set; raises DataLoss when it does not carry the token's HMAC."""
        if value is None or not self.secret:
            return value
        body, tag = value[:-32], value[-32:]
        if len(value) < 32 or not hmac.compare_digest(tag, mac(self.secret, self.spec.group_name, key, body)):
            raise DataLoss(
                f"weight group {self.spec.group_name!r}: {key} in the store is not signed with the "
                "service token; someone other than a member wrote the group's store"
            )
        return body

    # ------------------------------------------------------------------------ one update
    def announce(self, seq: int, first: bytes) -> None:
        """Sender: starts update <seq> with the header of its bucket 0 (wire.encode_header)."""
        self.store.set(f"update/{seq}", self._seal(f"update/{seq}", first))

    def await_announcement(self, seq: int, deadline: Deadline) -> bytes | None:
        """Receiver: the header of update <seq>'s bucket 0 once the sender starts it; None if it did
        not start in time."""
        return self._open(f"update/{seq}", await_values(self.store, [f"update/{seq}"], deadline)[0])

    def post_bucket(self, seq: int, index: int, header: bytes) -> None:
        """Sender: what comes next in update <seq> (wire.encode_header); receivers wait for it."""
        self.store.set(f"bucket/{seq}/{index}", self._seal(f"bucket/{seq}/{index}", header))

    def await_bucket(self, seq: int, index: int, deadline: Deadline) -> bytes:
        """Receiver: the header the sender posted for bucket <index>. Raises CollectiveFailed (timed
        out, or the store is gone with the trainer), which fails the update like a broken broadcast."""
        try:
            header = await_values(self.store, [f"bucket/{seq}/{index}"], deadline)[0]
        except Exception as e:  # Unavailable: the store is gone with the trainer
            raise CollectiveFailed(f"{deadline.what}: the trainer's store is unreachable ({e})", False) from e
        if header is None:
            raise CollectiveFailed(f"{deadline.what}: not posted within {deadline.seconds:.1f}s", True)
        try:
            return self._open(f"bucket/{seq}/{index}", header)
        except DataLoss as e:
            raise CollectiveFailed(f"{deadline.what}: {e}", False) from e

    def progress(self, seq: int, index: int) -> None:
        self.store.set(f"progress/{seq}/{self.rank}", str(index))

    def report_failure(self, seq: int, cause: str) -> None:
        """Best effort: the store may be gone with the trainer."""
        try:
            self.store.set(f"failed/{seq}/{self.rank}", cause[:500])
        except Exception:  # nobody left to tell
            self._stop.set()

    def ack(self, seq: int, refusal: BaseException | None) -> None:
        answer = "ok" if refusal is None else f"refused: {type(refusal).__name__}: {refusal}"
        self.store.set(f"ack/{seq}/{self.rank}", self._seal(f"ack/{seq}/{self.rank}", answer.encode()))

    def await_acks(
        self, seq: int, receivers: Sequence[int], deadline: Deadline
    ) -> tuple[list[int], dict[int, str], tuple[int, ...]]:
        """(ranks that confirmed, ranks that refused -> why, ranks that did not answer in time)."""
        answers = [
            self._verified(f"ack/{seq}/{r}", a)
            for r, a in zip(receivers, await_values(self.store, [f"ack/{seq}/{r}" for r in receivers], deadline))
        ]
        acked = [r for r, a in zip(receivers, answers, strict=True) if a == b"ok"]
        refused = {r: a.decode() for r, a in zip(receivers, answers, strict=True) if a is not None and a != b"ok"}
        return acked, refused, tuple(r for r, a in zip(receivers, answers, strict=True) if a is None)

    def _verified(self, key: str, value: bytes | None) -> bytes | None:
        """An acknowledgement, or None (no answer) when it is forged."""
        try:
            return self._open(key, value)
        except DataLoss as e:
            log.warning("%s", e)
            return None

    def diagnose(self, seq: int, receivers: Sequence[int], grace_s: float) -> tuple[tuple[int, ...], str]:
        """The receivers that stopped answering during update <seq>, and the evidence.

        Responsive: its heartbeat advances during the grace period, or it reported its own
        failure of this update. Unresponsive: the others, and any behind the rest in buckets
        received. If that singles out nobody, every receiver is suspect.
        """
        before = {r: self._peek(f"alive/{r}") for r in receivers}
        time.sleep(grace_s)
        after = {r: self._peek(f"alive/{r}") for r in receivers}
        failed = {r: self._peek(f"failed/{seq}/{r}") for r in receivers}
        progress = {r: int(self._peek(f"progress/{seq}/{r}") or -1) for r in receivers}
        top = max(progress.values())
        beating = {r for r in receivers if after[r] is not None and after[r] != before[r]}
        stopped = {r for r in receivers if (r not in beating and failed[r] is None) or progress[r] < top}
        reports = {r: f for r, f in failed.items() if f}
        evidence = f"buckets received {progress}, heartbeats {before} -> {after}, receivers' reports {reports}"
        return tuple(sorted(stopped)) or tuple(receivers), evidence

    def forget(self, seq: int, receivers: Sequence[int], buckets: int) -> None:
        """Deletes the keys of a finished update (its `buckets` headers plus any end marker), so a long
        job does not grow the store; in the background, so the next update does not wait for it."""
        keys = [f"update/{seq}", *(f"bucket/{seq}/{i}" for i in range(buckets + 1))]
        keys += [f"{k}/{seq}/{r}" for k in ("progress", "ack", "failed") for r in receivers]
        if self._janitor is None:
            self._janitor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-janitor")
        self._janitor.submit(self._delete, keys)

    def _delete(self, keys: list[str]) -> None:
        try:
            if self._janitor_store is None:
                self._janitor_store = self._connect(False, 10.0)
            for key in keys:
                self._janitor_store.delete_key(key)
        except Exception:  # the store is gone with the group: nothing left to clean
            self._janitor_store = None

    def _peek(self, key: str) -> str | None:
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except Exception:  # the store itself failed: treat the key as absent
            return None
