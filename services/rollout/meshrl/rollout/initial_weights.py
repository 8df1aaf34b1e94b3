"""Bringing a starting replica to the job's current weight version before it takes traffic.

Called by `__main__` before the replica reports "serving". The version comes from config
(`weights.path`: a version folder, or the folder of versions, newest complete one wins) or from
the registry (`ReplicaRegistry.current_weights`, which the scheduler sets after each publication).
A replica that cannot reach the job's version registers as "stale" and takes no traffic until refitted.
"""

from __future__ import annotations

import logging

from meshrl.common.errors import FailedPrecondition
from meshrl.common.registry import ReplicaRegistry
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.types import DiskUpdate, PauseMode
from meshrl.rollout.weight_receiver import manifest_version, newest_version

log = logging.getLogger(__name__)


def load_initial_weights(replica: RolloutReplica, path: str | None, registry: ReplicaRegistry | None) -> int:
    """Loads the newest known version if it is newer than the served one; returns the served version."""
    engine = replica.engine
    target_path, target_version = None, None
    if path:
        folder = newest_version(path)
        if folder is None:
            raise FailedPrecondition(f"weights.path {path} holds no complete weight version (vNNNNNN/manifest.json)")
        target_path, target_version = str(folder), manifest_version(folder)
    current = registry.current_weights() if registry is not None else None
    if current is not None and (target_version is None or current.version > target_version):
        if current.path:
            target_path, target_version = current.path, current.version
        elif current.version > engine.weight_version:
            log.warning("the job serves weight version %d but names no folder: registering as stale", current.version)
            replica.mark_stale()
            return engine.weight_version
    if target_path is None or target_version is None or target_version <= engine.weight_version:
        return engine.weight_version
    log.info("loading weight version %d from %s before serving", target_version, target_path)
    replica.update_weights_from_disk(DiskUpdate(target_path, target_version, pause_mode=PauseMode.ABORT))
    return engine.weight_version
