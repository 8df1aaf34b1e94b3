"""`python -m meshrl.scheduler`: the job API server (submit, get, watch, cancel, scale)."""

from __future__ import annotations

import logging
import sys

from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common import telemetry
from meshrl.common.config import parse_service_args
from meshrl.common.grpc_server import Service, start_server, wait_for_termination
from meshrl.scheduler.config import SchedulerServiceConfig
from meshrl.scheduler.job_policy import JobPolicy
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.server import SchedulerServicer


def main(argv: list[str] | None = None) -> None:
    cfg = parse_service_args(SchedulerServiceConfig, argv, "python -m meshrl.scheduler", __doc__.split("\n")[0])
    telemetry.install_log_correlation()
    logging.basicConfig(level=logging.INFO, format=telemetry.LOG_FORMAT)
    telemetry.setup_telemetry("scheduler", cfg.telemetry)
    policy = JobPolicy.operator(cfg.allowed_modules, cfg.run_root)
    jobs = JobManager(cfg.run_root, cfg.max_concurrent_jobs, policy)
    service = Service(
        scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(jobs), "meshrl.scheduler.v1.Scheduler"
    )
    running = start_server(cfg.server, [service])
    if cfg.recover_jobs:
        for record in jobs.recover():
            print(f"resumed job {record.job_id} from {record.runner.run.root}", flush=True)
    print(f"meshrl scheduler serving on {running.address}", flush=True)
    wait_for_termination(running, cfg.server.grace_seconds)


if __name__ == "__main__":
    main(sys.argv[1:])
