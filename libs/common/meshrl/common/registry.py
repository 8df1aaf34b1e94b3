"""The replica registry: which replicas of a service exist, where, and in what state, kept in Redis.

Each replica (today: rollout) writes one hash `{namespace}:{service}:replica:{id}` and refreshes it
with a heartbeat; the key's TTL drops a replica that died silently. The scheduler and the rollout
router list and watch it (`ReplicaRegistry.watch`); they request a drain with `request_drain`
(the replica sees it on its next heartbeat and reports state "draining"). The job's current weight
version lives beside it, so a replica started mid-job loads it before it reports "serving".

Anyone who can write the registry's Redis could otherwise add a replica (an address the scheduler dials with
its rollout token and adds to the weight group): with the service token (`token`), each entry and the current
weights carry an HMAC of it (`entry_hmac`), and readers holding the token skip entries without a valid one.
A malformed entry is skipped with a warning, never fatal to the listing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields

import redis

from meshrl.common.errors import DeadlineExceeded, InvalidArgument, Unavailable

log = logging.getLogger(__name__)

STARTING, SERVING, PAUSED, STALE, DRAINING = "starting", "serving", "paused", "stale", "draining"
STATES = (STARTING, SERVING, PAUSED, STALE, DRAINING)
HMAC_FIELD = "entry_hmac"


def entry_hmac(token: str, what: str, mapping: dict[str, str]) -> str:
    """HMAC-SHA256 of the service token over one registry record (`what` names its kind), fields sorted."""
    message = json.dumps([what, sorted((k, v) for k, v in mapping.items() if k != HMAC_FIELD)]).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def _text(raw: dict) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()
    }


@dataclass
class ReplicaInfo:
    """One replica as the registry holds it. state is one of STATES; only "serving" takes new traffic."""

    replica_id: str
    address: str  # host:port of its gRPC API
    engine: str = ""
    capacity: int = 1  # sequences it decodes at once
    weight_version: int = 0
    state: str = STARTING
    model_path: str = ""
    host: str = ""
    pid: int = 0
    updated_at: float = 0.0  # unix time of the last heartbeat
    extra: dict[str, str] = field(default_factory=dict)

    def to_mapping(self) -> dict[str, str]:
        data = asdict(self)
        data["extra"] = json.dumps(self.extra, sort_keys=True)
        return {k: str(v) for k, v in data.items()}

    @classmethod
    def from_mapping(cls, raw: dict) -> ReplicaInfo:
        data = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }
        kwargs = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name == "extra":
                kwargs[f.name] = json.loads(value or "{}")
            elif f.name in ("capacity", "weight_version", "pid"):
                kwargs[f.name] = int(value)
            elif f.name == "updated_at":
                kwargs[f.name] = float(value)
            else:
                kwargs[f.name] = value
        return cls(**kwargs)


@dataclass(frozen=True)
class CurrentWeights:
    """The weight version every replica of the job must serve, and where it is published (disk)."""

    version: int
    path: str = ""


def connect(redis_url: str) -> redis.Redis:
    try:
        client = redis.Redis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise Unavailable(
            f"registry Redis at {redis_url} is unreachable ({exc}); start Redis or fix registry.redis_url"
        ) from None
    except ValueError as exc:
        raise InvalidArgument(
            f"registry.redis_url {redis_url!r} is not a Redis URL ({exc}); use redis://host:port/db"
        ) from None
    return client


class ReplicaRegistry:
    def __init__(
        self,
        client: redis.Redis | str,
        *,
        namespace: str = "meshrl",
        service: str = "rollout",
        ttl_seconds: float = 10.0,
        token: str | None = None,
    ) -> None:
        """token: the service token; set, entries are written with its HMAC and only such entries are read."""
        self.token = token
        self.redis = connect(client) if isinstance(client, str) else client
        self.namespace = namespace
        self.service = service
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self._prefix = f"{namespace}:{service}"

    def _key(self, replica_id: str) -> str:
        return f"{self._prefix}:replica:{replica_id}"

    def _drain_key(self, replica_id: str) -> str:
        return f"{self._prefix}:drain:{replica_id}"

    @property
    def events_channel(self) -> str:
        return f"{self._prefix}:events"

    def _call(self, fn: Callable, *args):
        try:
            return fn(*args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unavailable(f"registry Redis is unreachable ({exc}); check that Redis runs") from None

    # --- replica side -----------------------------------------------------------------------
    def heartbeat(self, info: ReplicaInfo) -> None:
        """Writes (or re-creates) the replica's entry and restarts its TTL; publishes a change event."""
        if not info.replica_id or not info.address:
            raise InvalidArgument("a replica needs a non-empty replica_id and address to register")
        if info.state not in STATES:
            raise InvalidArgument(f"replica state {info.state!r} is not one of {STATES}")
        info.updated_at = time.time()
        key = self._key(info.replica_id)

        mapping = info.to_mapping()
        if self.token:
            mapping[HMAC_FIELD] = entry_hmac(self.token, "replica", mapping)

        def write():
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(key)
            pipe.hset(key, mapping=mapping)
            pipe.pexpire(key, self.ttl_ms)
            pipe.publish(self.events_channel, json.dumps({"replica_id": info.replica_id, "state": info.state}))
            pipe.execute()

        self._call(write)

    register = heartbeat

    def deregister(self, replica_id: str) -> None:
        def remove():
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(self._key(replica_id), self._drain_key(replica_id))
            pipe.publish(self.events_channel, json.dumps({"replica_id": replica_id, "state": "removed"}))
            pipe.execute()

        self._call(remove)

    def drain_requested(self, replica_id: str) -> bool:
        return bool(self._call(self.redis.exists, self._drain_key(replica_id)))

    # --- scheduler / router side --------------------------------------------------------------
    def request_drain(self, replica_id: str, ttl_seconds: float = 3600.0) -> None:
        """Asks a replica to take no new work; routers stop sending it requests at once."""

        def mark():
            pipe = self.redis.pipeline(transaction=True)
            pipe.set(self._drain_key(replica_id), "1", px=int(ttl_seconds * 1000))
            pipe.publish(self.events_channel, json.dumps({"replica_id": replica_id, "state": DRAINING}))
            pipe.execute()

        self._call(mark)

    def _admitted(self, key: str, raw: dict) -> ReplicaInfo | None:
        """The entry, when well-formed and (with a token) carrying the token's HMAC; None, with a warning, else."""
        data = _text(raw)
        if self.token and not hmac.compare_digest(data.get(HMAC_FIELD, ""), entry_hmac(self.token, "replica", data)):
            log.warning(
                "registry entry %s is not signed with this service's token: ignored (a stranger's write, "
                "or a replica without the token: set its server.auth)",
                key,
            )
            return None
        try:
            info = ReplicaInfo.from_mapping(data)
            host, _, port = info.address.rpartition(":")
            if not info.replica_id or not host or not port.isdigit() or info.state not in STATES:
                raise ValueError(f"replica_id {info.replica_id!r}, address {info.address!r}, state {info.state!r}")
        except (ValueError, TypeError) as exc:
            log.warning("registry entry %s is malformed (%s): ignored", key, exc)
            return None
        return info

    def get(self, replica_id: str) -> ReplicaInfo | None:
        raw = self._call(self.redis.hgetall, self._key(replica_id))
        if not raw:
            return None
        info = self._admitted(self._key(replica_id), raw)
        if info is None:
            return None
        if self.drain_requested(replica_id):
            info.state = DRAINING
        return info

    def list(self, states: Iterable[str] | None = None) -> list[ReplicaInfo]:
        """Every live replica (draining ones report "draining"), sorted by id; `states` filters."""
        wanted = set(states) if states is not None else None
        keys = sorted(self._call(lambda: list(self.redis.scan_iter(match=f"{self._prefix}:replica:*", count=500))))
        drains = {
            k.decode().rsplit(":", 1)[-1]
            for k in self._call(lambda: list(self.redis.scan_iter(match=f"{self._prefix}:drain:*", count=500)))
        }
        out = []
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        for key, raw in zip(keys, self._call(pipe.execute) if keys else []):
            if not raw:
                continue  # expired between the scan and the read
            info = self._admitted(key.decode() if isinstance(key, bytes) else key, raw)
            if info is None:
                continue
            if info.replica_id in drains:
                info.state = DRAINING
            if wanted is None or info.state in wanted:
                out.append(info)
        return sorted(out, key=lambda i: i.replica_id)

    def wait_for(
        self, predicate: Callable[[list[ReplicaInfo]], bool], *, timeout: float, interval: float = 0.2
    ) -> list[ReplicaInfo]:
        """Polls until `predicate(list())` holds; DeadlineExceeded with the last listing otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            replicas = self.list()
            if predicate(replicas):
                return replicas
            if time.monotonic() >= deadline:
                summary = ", ".join(f"{r.replica_id}={r.state}@v{r.weight_version}" for r in replicas) or "none"
                raise DeadlineExceeded(
                    f"{self.service} replicas did not reach the wanted state in {timeout:.0f}s: {summary}"
                )
            time.sleep(interval)

    def set_current_weights(self, weights: CurrentWeights) -> None:
        """Records the version replicas must serve (the scheduler calls it after each publication)."""
        record = {"version": str(weights.version), "path": weights.path}
        if self.token:
            record[HMAC_FIELD] = entry_hmac(self.token, "current_weights", record)
        self._call(self.redis.set, f"{self._prefix}:current_weights", json.dumps(record))

    def current_weights(self) -> CurrentWeights | None:
        """The job's current weights; None when unset, malformed or (with a token) not signed with it."""
        raw = self._call(self.redis.get, f"{self._prefix}:current_weights")
        if not raw:
            return None
        try:
            data = json.loads(raw)
            record = {"version": str(data["version"]), "path": str(data.get("path", ""))}
            weights = CurrentWeights(int(record["version"]), record["path"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("registry current_weights is malformed (%s): ignored", exc)
            return None
        if self.token and not hmac.compare_digest(
            str(data.get(HMAC_FIELD, "")), entry_hmac(self.token, "current_weights", record)
        ):
            log.warning("registry current_weights is not signed with this service's token: ignored")
            return None
        return weights

    def watch(self, on_change: Callable[[list[ReplicaInfo]], None], *, interval: float = 0.5) -> Watcher:
        """Calls `on_change(listing)` from a background thread whenever the listing changes (first call at once)."""
        watcher = Watcher(self, on_change, interval)
        watcher.start()
        return watcher


def _signature(replicas: list[ReplicaInfo]) -> list[tuple]:
    return [(r.replica_id, r.address, r.state, r.weight_version, r.capacity) for r in replicas]


class Watcher:
    """Background listing of a registry: wakes on change events, and polls to notice expired replicas."""

    def __init__(self, registry: ReplicaRegistry, on_change: Callable[[list[ReplicaInfo]], None], interval: float):
        self.registry = registry
        self.on_change = on_change
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registry-watch", daemon=True)
        self._pubsub = registry.redis.pubsub(ignore_subscribe_messages=True)

    def start(self) -> None:
        self._pubsub.subscribe(self.registry.events_channel)
        self._thread.start()

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            try:
                replicas = self.registry.list()
                sig = _signature(replicas)
                if sig != last:
                    last = sig
                    self.on_change(replicas)
                self._pubsub.get_message(timeout=self.interval)
                while self._pubsub.get_message(timeout=0) is not None:
                    pass
            except Unavailable as exc:
                log.warning("registry watch: %s", exc)
                self._stop.wait(self.interval)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("registry watch: %s", exc)
                self._stop.wait(self.interval)
            except Exception:  # noqa: BLE001 - a failing callback must not end the watch
                log.exception("registry watch callback failed")
                self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._pubsub.close()
        except redis.RedisError:
            pass


class Heartbeat:
    """The replica side: refreshes its entry every `interval` seconds from `info_fn()` until stopped."""

    def __init__(self, registry: ReplicaRegistry, info_fn: Callable[[], ReplicaInfo], interval: float) -> None:
        self.registry = registry
        self.info_fn = info_fn
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registry-heartbeat", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        self.registry.heartbeat(self.info_fn())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - keep beating; Redis may come back
                log.warning("registry heartbeat failed: %s", exc)

    def stop(self, deregister_id: str | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if deregister_id:
            try:
                self.registry.deregister(deregister_id)
            except Exception as exc:  # noqa: BLE001 - the TTL removes it anyway
                log.warning("could not deregister %s: %s", deregister_id, exc)
