"""The scheduler's gRPC job API: proto in, JobManager call, proto out; each call acts as its caller's identity
(`meshrl.scheduler.job_access`), which may act only on its own jobs unless it is an admin."""

from __future__ import annotations

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.job_access import Callers
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, jobs: JobManager, callers: Callers | None = None) -> None:
        """callers: names each call's identity (default: a scheduler without authentication, where every
        caller may act on every job)."""
        self.jobs = jobs
        self.callers = callers or Callers()

    def SubmitJob(self, request: spb.SubmitJobRequest, context) -> spb.Job:
        if bool(request.workflow_yaml) == bool(request.workflow_name):
            raise InvalidArgument("give exactly one of workflow_yaml and workflow_name")
        text = request.workflow_yaml or builtin_workflow_text(request.workflow_name)
        record = self.jobs.create(
            text,
            request.config_yaml,
            list(request.overrides),
            request.job_id,
            request.resume_run_dir,
            caller=self.callers.of(context),
        )
        self.jobs.start(record)
        return record.to_proto()

    def GetJob(self, request: spb.GetJobRequest, context) -> spb.Job:
        return self.jobs.get(request.job_id, self.callers.of(context)).to_proto()

    def ListJobs(self, request: spb.ListJobsRequest, context) -> spb.ListJobsResponse:
        return spb.ListJobsResponse(jobs=[r.to_proto() for r in self.jobs.visible(self.callers.of(context))])

    def WatchJob(self, request: spb.WatchJobRequest, context):
        events = self.jobs.get(request.job_id, self.callers.of(context), "watch").events
        position = request.from_sequence
        while context.is_active():
            batch, closed = events.read(position, timeout=1.0)
            yield from batch
            position += len(batch)
            if closed and not batch:
                return

    def CancelJob(self, request: spb.CancelJobRequest, context) -> spb.Job:
        return self.jobs.cancel(request.job_id, self.callers.of(context)).to_proto()

    def ScaleService(self, request: spb.ScaleServiceRequest, context) -> spb.ScaleServiceResponse:
        addresses = self.jobs.scale(request.job_id, request.service, request.replicas, self.callers.of(context))
        return spb.ScaleServiceResponse(replicas=len(addresses), addresses=addresses)
