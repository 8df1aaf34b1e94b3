"""`meshrl plan WORKFLOW --nodes N --gpus-per-node G`: print how a workflow would be split and placed,
without starting anything (and, under services.cpu_placement, each launched service's cores on this host). The `meshrl` CLI (cli.py) calls `plan_main(argv)`; `add_plan_arguments` and
`run_plan` let it mount the command as a subparser instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

import pydantic

from meshrl.common.config import deep_merge, parse_overrides, read_yaml
from meshrl.common.errors import MeshrlError
from meshrl.scheduler.config.cpu_placement import CpuPlacement
from meshrl.scheduler.config.services import ServicesSection
from meshrl.scheduler.launch.cpu_placement import CpuSets, cpu_sets
from meshrl.scheduler.launch.trainer_layout import apply_trainer_layout, trainer_section
from meshrl.scheduler.planning.apportion import ClusterSpec
from meshrl.scheduler.planning.plan_render import render_plan
from meshrl.scheduler.planning.planner import DEFAULT_COSTS, Placement, PlanError, PlanOptions, Strategy, plan_workflow
from meshrl.scheduler.workflow import builtin_names, load_workflow

# What `meshrl run` launches when the job config names no placement: one default for both commands.
LAUNCHED_PLACEMENT: str = ServicesSection.model_fields["placement"].default


def _pairs(items: Sequence[str], what: str, example: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise PlanError(f"{what} '{item}' is not NAME=VALUE. Fix: write e.g. {example}")
        out[key.strip()] = value.strip()
    return out


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow", help=f"workflow file, or a built-in: {', '.join(builtin_names())}")
    parser.add_argument("--nodes", type=int, default=1, help="machines in the cluster (default 1)")
    devices = parser.add_mutually_exclusive_group()
    devices.add_argument("--gpus-per-node", type=int, help="GPUs per machine (default 8)")
    devices.add_argument("--cpus-per-node", type=int, help="CPU worker slots per machine, for clusters without GPUs")
    parser.add_argument(
        "--placement",
        choices=[p.value for p in Placement],
        default=None,
        help="colocated: every model on every device; disaggregated: rollout and trainer models on separate devices "
        "(default: the job config's services.placement, which `meshrl run` launches, and its default "
        f"{LAUNCHED_PLACEMENT!r})",
    )
    parser.add_argument("--strategy", choices=[s.value for s in Strategy], default=Strategy.PARAM_AWARE.value)
    parser.add_argument(
        "--param-counts",
        nargs="+",
        action="extend",
        default=[],
        metavar="MODEL=N",
        help="parameters per model or role, e.g. actor=7B reference=7B critic=1.5B (rollout defaults to actor)",
    )
    parser.add_argument(
        "--cost",
        nargs="+",
        action="extend",
        default=[],
        metavar="KIND=X",
        help="relative cost per parameter of forward / train / rollout nodes (default "
        + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_COSTS.items())
        + ")",
    )
    parser.add_argument("--config", metavar="FILE", help="job config YAML that ${config...} references read")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--allow-module",
        action="append",
        default=None,
        metavar="PREFIX",
        help="module prefix executable_refs may import from (repeatable; '*' for any)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run_plan(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    """Plans and prints; raises MeshrlError subclasses on bad input."""
    stdout = stdout or sys.stdout
    config = read_yaml(args.config) if args.config else {}
    config = deep_merge(config, parse_overrides(args.overrides))
    workflow = load_workflow(args.workflow, config, allowed_modules=args.allow_module)
    apply_trainer_layout(workflow, trainer_section(config))  # the trainer's TP / PP as `meshrl run` launches it
    if args.cpus_per_node is not None:
        cluster = ClusterSpec(args.nodes, args.cpus_per_node, "CPU")
    else:
        cluster = ClusterSpec(args.nodes, 8 if args.gpus_per_node is None else args.gpus_per_node, "GPU")
    costs = {**DEFAULT_COSTS}
    for kind, value in _pairs(args.cost, "--cost", "train=3").items():
        if kind not in DEFAULT_COSTS:
            raise PlanError(f"--cost {kind}: unknown node kind. Fix: use one of {', '.join(DEFAULT_COSTS)}")
        try:
            costs[kind] = float(value)
        except ValueError:
            raise PlanError(f"--cost {kind}={value}: not a number. Fix: write e.g. {kind}=2.5") from None
    options = PlanOptions(
        placement=Placement(args.placement or (config.get("services") or {}).get("placement") or LAUNCHED_PLACEMENT),
        strategy=Strategy(args.strategy),
        param_counts=_pairs(args.param_counts, "--param-counts", "actor=7B"),
        costs=costs,
    )
    plan = plan_workflow(workflow, cluster, options)
    cores = host_cpu_sets(config)
    if args.json:
        out = plan.to_dict() if cores is None else {**plan.to_dict(), "cpu_placement": cores.as_dict()}
        stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        stdout.write(render_plan(plan))
        if cores is not None:
            stdout.write(f"CPU placement on this host (services.cpu_placement):\n{cores.describe()}\n")
    return 0


def host_cpu_sets(config: dict) -> CpuSets | None:
    """The cores `meshrl run` would give each launched service on this host (None without
    services.cpu_placement), checked by the same rules as the job config's."""
    raw = (config.get("services") or {}).get("cpu_placement")
    if raw is None:
        return None
    try:
        placement = CpuPlacement(**raw)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        where = "".join(f"services.cpu_placement.{'.'.join(map(str, error['loc']))}: " for _ in error["loc"][:1])
        raise PlanError(where + error["msg"].removeprefix("Value error, ")) from None
    return cpu_sets(placement, int((config.get("rollout") or {}).get("replicas", 1)))


def plan_main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Entry point of `meshrl plan`; returns the exit status (0, or 2 with a message on stderr)."""
    parser = argparse.ArgumentParser(prog="meshrl plan", description=__doc__.split("\n")[0])
    add_plan_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_plan(args, stdout)
    except MeshrlError as exc:
        (stderr or sys.stderr).write(f"meshrl plan: error: {exc}\n")
        return 2
