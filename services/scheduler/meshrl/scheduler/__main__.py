"""`python -m meshrl.scheduler`: the job API server (submit, get, watch, cancel, scale), each job acted on only
by its submitter or an admin (`job_access`)."""

from __future__ import annotations

import sys

from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.config import parse_service_args
from meshrl.common.grpc_server import Service
from meshrl.common.service_main import Hosted, run_service
from meshrl.scheduler.config import SchedulerServiceConfig
from meshrl.scheduler.job_policy import JobPolicy
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.server import SchedulerServicer

SERVICE_NAME = "meshrl.scheduler.v1.Scheduler"


def main(argv: list[str] | None = None) -> None:
    cfg = parse_service_args(SchedulerServiceConfig, argv, "python -m meshrl.scheduler", __doc__.split("\n")[0])

    def build() -> Hosted:
        # the operator's limits, never the job's
        policy = JobPolicy.operator(cfg.allowed_modules, cfg.run_root, cfg.job_permissions, cfg.channels)
        jobs = JobManager(cfg.run_root, cfg.max_concurrent_jobs, policy, cfg.keep_finished_jobs)
        mtls = cfg.server.tls is not None and cfg.server.tls.ca_file is not None
        servicer = SchedulerServicer(jobs, cfg.job_access.callers(cfg.server.auth.token(), mtls))

        def started(_running) -> None:
            if cfg.recover_jobs:  # the runs a previous scheduler left running
                for record in jobs.recover():
                    print(f"resumed job {record.job_id} from {record.runner.run.root}", flush=True)

        service = Service(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer, SERVICE_NAME)
        return Hosted([service], started=started, tokens=list(cfg.job_access.tokens().values()))

    run_service("scheduler", cfg, build)


if __name__ == "__main__":
    main(sys.argv[1:])
