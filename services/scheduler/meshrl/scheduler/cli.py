"""The `meshrl` command: run a job in the foreground, talk to a scheduler service (submit,
status, watch, cancel, scale), plan a workflow, render traces, and start/stop a local set
of services for development (up / down).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from meshrl.common.errors import MeshrlError

DEFAULT_SCHEDULER = os.environ.get("MESHRL_SCHEDULER", "127.0.0.1:50050")


def _workflow_text(spec: str) -> tuple[str, Path | None]:
    from meshrl.scheduler.workflow import builtin_workflow_text

    path = Path(spec)
    if path.is_file():
        return path.read_text(), path
    return builtin_workflow_text(spec), None


def _config_text(configs: list[str], workflow_path: Path | None) -> str:
    """The job config: the --config files merged in order (default: config.yaml beside the workflow)."""
    import yaml

    from meshrl.common.config import deep_merge, read_yaml

    if not configs and workflow_path is not None and (workflow_path.parent / "config.yaml").is_file():
        configs = [str(workflow_path.parent / "config.yaml")]
    merged: dict = {}
    for path in configs:
        merged = deep_merge(merged, read_yaml(path))
    return yaml.safe_dump(merged) if merged else ""


def cmd_run(args) -> int:
    from meshrl.common import telemetry
    from meshrl.scheduler.jobs import JobManager

    sys.path.insert(0, os.getcwd())  # executable_refs and generators may live in the working tree
    workflow, path = _workflow_text(args.workflow)
    jobs = JobManager()
    overrides = list(args.overrides)
    record = jobs.create(
        workflow,
        _config_text(args.config, path),
        overrides,
        resume_dir=args.resume or "",
        progress=not args.no_progress,
    )
    cfg = record.runner.cfg
    telemetry.setup_telemetry(
        "scheduler", cfg.telemetry.model_copy(update={"path": str(record.runner.run.traces / "scheduler.jsonl")})
    )
    print(f"run folder: {record.runner.run.root}", file=sys.stderr)
    try:
        if args.val_only:
            metrics = record.runner.run_eval_only(args.checkpoint)
            print("\n".join(f"{k}: {v:.4f}" for k, v in metrics.items()))
            return 0
        jobs.run(record)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: services stopped; resume with `meshrl run {args.workflow} --resume "
            f"{record.runner.run.root}`",
            file=sys.stderr,
        )
        return 130
    finally:
        telemetry.shutdown_telemetry()
    summary = record.summary
    if record.error:
        print(record.error, file=sys.stderr)
        return 1
    print(f"done: {summary}")
    print(f"report: {record.runner.run.report_file}")
    return 0


def _scheduler_channel(args):
    """The channel config to the scheduler: --channel FILE < MESHRL_SCHEDULER_CHANNEL__* < flags."""
    from meshrl.common.config import load_config
    from meshrl.common.grpc_channel import ChannelConfig

    flags = [
        f"tls.{k}={v}"
        for k, v in (("ca_file", args.tls_ca), ("cert_file", args.tls_cert), ("key_file", args.tls_key))
        if v
    ] + ([f"auth.token_file={args.token_file}"] if args.token_file else [])
    return load_config(ChannelConfig, path=args.channel, overrides=flags, env_prefix="MESHRL_SCHEDULER_CHANNEL__")


def _stub(args):
    from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
    from meshrl.common.grpc_channel import open_channel
    from meshrl.common.peers import check_peer

    cfg = _scheduler_channel(args)
    check_peer("the scheduler", cfg, field="--channel", address=args.scheduler, timeout=min(cfg.check_seconds, 15))
    return scheduler_pb2_grpc.SchedulerStub(open_channel(args.scheduler, cfg))


def _print_job(job, where: bool = False) -> None:
    """One line per job; with `where`, a line per launched service or trainer rank under it."""
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
    from meshrl.scheduler.launch.whereabouts import describe

    print(
        f"{job.job_id}  {spb.JobState.Name(job.state).removeprefix('JOB_STATE_')}  step {job.step}/{job.total_steps}"
        f"  {job.run_dir}" + (f"\n{job.error}" if job.error else "")
    )
    for line in describe(job.placements) if where else ():
        print(f"  {line}")


def cmd_submit(args) -> int:
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
    from meshrl.common.grpc_channel import call

    workflow, path = _workflow_text(args.workflow)
    req = spb.SubmitJobRequest(
        workflow_yaml=workflow,
        config_yaml=_config_text(args.config, path),
        overrides=args.overrides,
        job_id=args.job_id or "",
    )
    _print_job(call(_stub(args).SubmitJob, req, timeout=120))
    return 0


def cmd_status(args) -> int:
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
    from meshrl.common.grpc_channel import call

    stub = _stub(args)
    if args.job_id:
        _print_job(call(stub.GetJob, spb.GetJobRequest(job_id=args.job_id), timeout=30), where=True)
    else:
        for job in call(stub.ListJobs, spb.ListJobsRequest(), timeout=30).jobs:
            _print_job(job)
    return 0


def cmd_watch(args) -> int:
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb

    for event in _stub(args).WatchJob(spb.WatchJobRequest(job_id=args.job_id)):
        kind = event.WhichOneof("body")
        if kind == "node":
            n = event.node
            print(
                f"step {n.step} node {n.node_id}: {spb.NodeState.Name(n.state).removeprefix('NODE_STATE_')}"
                + (f" ({n.seconds:.2f}s)" if n.seconds else "")
                + (f"\n{n.error}" if n.error else "")
            )
        elif kind == "metrics":
            m = event.metrics.metrics
            print(f"step {event.metrics.step}: " + " ".join(f"{k}={m[k]:.4g}" for k in sorted(m) if "/" in k))
        elif kind == "state":
            print(f"job {spb.JobState.Name(event.state.state).removeprefix('JOB_STATE_')}: {event.state.message}")
        else:
            print(event.log)
    return 0


def cmd_cancel(args) -> int:
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
    from meshrl.common.grpc_channel import call

    _print_job(call(_stub(args).CancelJob, spb.CancelJobRequest(job_id=args.job_id), timeout=30))
    return 0


def cmd_scale(args) -> int:
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
    from meshrl.common.grpc_channel import call

    req = spb.ScaleServiceRequest(job_id=args.job_id, service=args.service, replicas=args.replicas)
    reply = call(_stub(args).ScaleService, req, timeout=900)
    print(f"{args.service}: {reply.replicas} replicas: {', '.join(reply.addresses)}")
    return 0


def cmd_report(args) -> int:
    import json

    from meshrl.scheduler.report import write_report
    from meshrl.scheduler.rundir import RunDir

    run = RunDir(Path(args.run_dir))
    summary = json.loads(run.summary_file.read_text()) if run.summary_file.exists() else {}
    print(write_report(run, summary))
    return 0


def cmd_ui(args) -> int:
    from meshrl.scheduler.liveview import LiveView

    view = LiveView(args.run_root, args.host, args.port)
    print(f"live view of {Path(args.run_root).resolve()}: {view.url}", file=sys.stderr, flush=True)
    try:
        view.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshrl", description="RL post-training of LLMs across services")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_overrides(p):
        p.add_argument(
            "--config",
            action="append",
            default=[],
            help="job config YAML, repeatable: later files "
            "override earlier ones (default: config.yaml beside the workflow)",
        )
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    p = sub.add_parser("run", help="run a workflow locally in the foreground")
    p.add_argument("workflow", help="workflow YAML file or built-in name (grpo, ppo, dapo, reinforce_pp, rloo)")
    with_overrides(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--val-only", action="store_true", help="only evaluate the model (or --checkpoint)")
    p.add_argument("--checkpoint", help="with --val-only: a checkpoint folder to evaluate")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=cmd_run)

    for name, fn, helptext in (("submit", cmd_submit, "submit a job to a scheduler service"),):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("workflow")
        with_overrides(p)
        p.add_argument("--job-id")
        p.set_defaults(fn=fn)
    for name, fn, helptext in (
        ("status", cmd_status, "show jobs (given a job id: where its services and trainer ranks run)"),
        ("watch", cmd_watch, "follow a job's events"),
        ("cancel", cmd_cancel, "cancel a job"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("job_id", nargs="?" if name == "status" else None)
        p.set_defaults(fn=fn)
    p = sub.add_parser("scale", help="resize a running job's rollout fleet")
    p.add_argument("service", choices=["rollout"])
    p.add_argument("replicas", type=int)
    p.add_argument("--job-id", required=True)
    p.set_defaults(fn=cmd_scale)
    for p in sub.choices.values():
        if p.prog.split()[-1] in ("submit", "status", "watch", "cancel", "scale"):
            p.add_argument("--scheduler", default=DEFAULT_SCHEDULER, help="scheduler address (env MESHRL_SCHEDULER)")
            p.add_argument("--channel", metavar="FILE", help="channel config YAML (tls, auth) to the scheduler")
            p.add_argument("--tls-ca", help="CA of the scheduler's certificate (turns on TLS)")
            p.add_argument("--tls-cert", help="client certificate (mutual TLS)")
            p.add_argument("--tls-key", help="client key (mutual TLS)")
            p.add_argument("--token-file", help="file holding the scheduler's token")

    p = sub.add_parser("report", help="(re)write a run's plots and HTML report")
    p.add_argument("run_dir")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("ui", help="serve a live page per run in a browser (reads the run folders)")
    p.add_argument("run_root", nargs="?", default="runs", help="folder of run folders (job.run_root)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8270, help="0: any free port (printed)")
    p.set_defaults(fn=cmd_ui)
    sub.add_parser("plan", help="print the task plan of a workflow", add_help=False)
    sub.add_parser("trace", help="render a run's traces", add_help=False)
    sub.add_parser("up", help="start a local set of independent services", add_help=False)
    sub.add_parser("down", help="stop the services started by `meshrl up`", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("MESHRL_LOG_LEVEL", "WARNING"))
    if argv and argv[0] == "plan":
        from meshrl.scheduler.planning.plan_cli import plan_main

        return plan_main(argv[1:])
    if argv and argv[0] == "trace":
        from meshrl.scheduler.traceview import trace_main

        return trace_main(argv[1:])
    if argv and argv[0] in ("up", "down"):
        from meshrl.scheduler.launch.local_cluster import local_main

        return local_main(argv)
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except MeshrlError as exc:
        print(f"meshrl {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
