"""The scheduler's gRPC job API: proto in, JobManager call, proto out."""

from __future__ import annotations

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, jobs: JobManager) -> None:
        self.jobs = jobs

    def SubmitJob(self, request: spb.SubmitJobRequest, context) -> spb.Job:
        if bool(request.workflow_yaml) == bool(request.workflow_name):
            raise InvalidArgument("give exactly one of workflow_yaml and workflow_name")
        text = request.workflow_yaml or builtin_workflow_text(request.workflow_name)
        record = self.jobs.create(
            text, request.config_yaml, list(request.overrides), request.job_id, request.resume_run_dir
        )
        self.jobs.start(record)
        return record.to_proto()

    def GetJob(self, request: spb.GetJobRequest, context) -> spb.Job:
        return self.jobs.get(request.job_id).to_proto()

    def ListJobs(self, request: spb.ListJobsRequest, context) -> spb.ListJobsResponse:
        return spb.ListJobsResponse(jobs=[self.jobs.get(j).to_proto() for j in list(self.jobs.jobs)])

    def WatchJob(self, request: spb.WatchJobRequest, context):
        events = self.jobs.get(request.job_id).events
        position = request.from_sequence
        while context.is_active():
            batch, closed = events.read(position, timeout=1.0)
            yield from batch
            position += len(batch)
            if closed and not batch:
                return

    def CancelJob(self, request: spb.CancelJobRequest, context) -> spb.Job:
        return self.jobs.cancel(request.job_id).to_proto()

    def ScaleService(self, request: spb.ScaleServiceRequest, context) -> spb.ScaleServiceResponse:
        addresses = self.jobs.scale(request.job_id, request.service, request.replicas)
        return spb.ScaleServiceResponse(replicas=len(addresses), addresses=addresses)
