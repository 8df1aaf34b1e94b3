"""A job's event log: node status changes, step metrics, state changes and log lines, in order.

The step executor and job runner append; WatchJob and the CLI read from any sequence
number and block for new events. Events are also appended to `events.jsonl` in the run
folder so a finished or crashed run can be read back.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from google.protobuf import json_format

from meshrl.api.scheduler.v1 import scheduler_pb2 as pb


class EventLog:
    def __init__(self, job_id: str, path: Path | None = None) -> None:
        self.job_id = job_id
        self.path = path
        self._events: list[pb.JobEvent] = []
        self._cond = threading.Condition()
        self._closed = False

    def _append(self, **body) -> pb.JobEvent:
        with self._cond:
            event = pb.JobEvent(sequence=len(self._events), time=time.time(), job_id=self.job_id, **body)
            self._events.append(event)
            if self.path is not None:
                with open(self.path, "a") as f:
                    f.write(json.dumps(json_format.MessageToDict(event)) + "\n")
            self._cond.notify_all()
        return event

    def node(self, step: int, node_id: str, state: int, seconds: float = 0.0, error: str = "") -> None:
        self._append(node=pb.NodeEvent(step=step, node_id=node_id, state=state, seconds=seconds, error=error))

    def metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._append(metrics=pb.StepMetrics(step=step, metrics=metrics))

    def state(self, state: int, message: str = "") -> None:
        self._append(state=pb.JobStateChange(state=state, message=message))

    def log(self, line: str) -> None:
        self._append(log=line)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def read(self, start: int, timeout: float | None = None) -> tuple[list[pb.JobEvent], bool]:
        """Events from `start` on (waiting up to `timeout` for one); and whether the log is closed."""
        with self._cond:
            if start >= len(self._events) and not self._closed:
                self._cond.wait(timeout)
            return list(self._events[start:]), self._closed

    def errors(self) -> list[str]:
        return [e.node.error for e in self._events if e.WhichOneof("body") == "node" and e.node.error]
