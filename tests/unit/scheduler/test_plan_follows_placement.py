"""`meshrl plan` given the job config plans the placement the job launches (`services.placement`), unless
`--placement` says otherwise; without either it plans the placement `meshrl run` launches without one
(services.placement's default, disaggregated)."""

from __future__ import annotations

import io
import json

from meshrl.scheduler.config.services import ServicesSection
from meshrl.scheduler.planning.plan_cli import plan_main


def planned(*argv: str) -> str:
    out = io.StringIO()
    assert plan_main(["grpo", "--nodes", "1", "--gpus-per-node", "4", "--json", *argv], stdout=out) == 0
    return json.loads(out.getvalue())["placement"]


def test_plan_follows_the_jobs_placement(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("services:\n  placement: disaggregated\n")
    assert planned("--config", str(config)) == "disaggregated"
    assert planned("--set", "services.placement=colocated") == "colocated"
    assert planned("--config", str(config), "--placement", "colocated") == "colocated"
    assert planned() == "disaggregated" == ServicesSection().placement
