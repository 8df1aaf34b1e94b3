"""What changes the rollout fleet between two steps of a job: `meshrl scale` (ScaleService, asked from
another thread and applied by the step loop before its next step) and replicas that register or leave
through the registry. Owned by the job runner (step/job/runner.py)."""

from __future__ import annotations

import threading
from typing import Any

from meshrl.common.errors import DeadlineExceeded, FailedPrecondition, MeshrlError
from meshrl.common.registry import CurrentWeights


class FleetChanges:
    def __init__(self, cfg: Any, events: Any) -> None:
        self.cfg = cfg
        self.events = events
        self.target: int | None = None  # the replica count asked for, until the step loop applied it
        self.error: MeshrlError | None = None
        self.addresses: list[str] = []  # the fleet after the last change
        self._cond = threading.Condition()

    def request(self, replicas: int, timeout: float) -> list[str]:
        """Waits until the step loop resized the fleet to `replicas`; returns its addresses (or its refusal)."""
        with self._cond:
            self.target = replicas
            if not self._cond.wait_for(lambda: self.target is None, timeout):
                raise DeadlineExceeded(f"the fleet was not resized to {replicas} within {timeout:.0f}s")
            error, self.error = self.error, None
            if error is not None:
                raise error
            return list(self.addresses)

    def apply(self, svc: Any, publisher: Any, colocated: bool) -> None:
        """The step loop's side: resizes the fleet to the asked count, or records why it cannot."""
        with self._cond:
            target = self.target
            if target is not None and colocated:
                self.error = FailedPrecondition(
                    "this job runs colocated (services.placement: colocated): its replicas share the trainer's "
                    "bundle, which has no room for more. Run it disaggregated to scale the fleet"
                )
            elif target is not None and (svc.registry is not None or self.cfg.rollout.addresses):
                self.error = FailedPrecondition(
                    "this job's rollout replicas are deployed on their own (rollout.registry / rollout.addresses): "
                    "the scheduler cannot start or stop processes in that cluster. Scale them with its own "
                    "scaler (`kubectl scale deployment/meshrl-rollout --replicas=N`, the HPA, or start one more "
                    "replica with the job's registry settings); the job adopts replicas that register and lets "
                    "drained ones go"
                )
            elif target is not None:
                self._resize(svc, publisher, target)
            self.target = None
            self.addresses = svc.fleet.addresses()
            self._cond.notify_all()

    def _resize(self, svc: Any, publisher: Any, target: int) -> None:
        current = svc.fleet.addresses()
        if target > len(current):
            for address in svc.add_replicas(target - len(current)):
                client = svc.fleet.client_for(address)
                client.wait_ready(self.cfg.services.start_timeout_seconds)
                publisher.refit_from_disk(client)  # new replicas serve the current version first
                svc.fleet.add(address)
        for address in current[target:]:
            svc.remove_replica(address)  # drains, then stops
        self.events.log(f"rollout fleet resized to {target}: {svc.fleet.addresses()}")

    def follow_registry(self, svc: Any, publisher: Any) -> None:
        """Replicas that registered since the last step join (refitted and verified first); drained
        or dead ones are forgotten once their work is done. The current version is where newcomers look."""
        if svc.registry is None:
            return
        disk = publisher.last_disk
        path = disk.path if disk is not None and disk.version == publisher.version else ""
        svc.registry.set_current_weights(CurrentWeights(publisher.version, path))
        for address in svc.fleet.admit(publisher.refit_from_disk):
            self.events.log(f"replica {address} joined at weight version {publisher.version} (verified)")
        for address in svc.fleet.retire_left():
            self.events.log(f"replica {address} left the fleet (drained or heartbeat stopped)")
