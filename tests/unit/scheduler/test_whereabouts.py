"""Where a job's services run, as GetJob and `meshrl status JOB` show it: launched instances with their Ray
node and bundle, a trainer group's ranks in place of the trainer's row, replicas that joined by registry."""

from __future__ import annotations

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.scheduler.launch.placement import BundleLocation
from meshrl.scheduler.launch.trainer_group import RankPlacement
from meshrl.scheduler.launch.whereabouts import describe, service_of, whereabouts


def test_service_of_a_launched_or_named_instance():
    assert [service_of(n) for n in ("databuffer", "trainer", "rollout-0", "rollout-12", "rollout@10.0.0.5:50051")] == [
        "databuffer",
        "trainer",
        "rollout",
        "rollout",
        "rollout",
    ]


def test_a_trainer_groups_ranks_replace_the_trainers_row_and_ray_bundles_name_the_node():
    addresses = {"databuffer": "127.0.0.2:7000", "trainer": "127.0.0.3:7001", "rollout-0": "127.0.0.2:7002"}
    bundles = {
        "databuffer": ("pg-a", BundleLocation(0, "node-a", "127.0.0.2", ())),
        "rollout-0": ("pg-b", BundleLocation(1, "node-a", "127.0.0.2", (3,))),
    }
    ranks = (
        RankPlacement(0, "n1:0", "127.0.0.3", "node-b", 0, ()),
        RankPlacement(1, "n1:1", "127.0.0.3", "node-b", 1, ()),
    )
    rows = whereabouts(addresses, bundles, ranks, replicas=["127.0.0.2:7002", "10.0.0.9:7009"])
    placements = [spb.Placement(**row) for row in rows]  # every row is a valid message
    assert [(p.service, p.rank, p.address, p.node, p.bundle) for p in placements] == [
        ("databuffer", 0, "127.0.0.2:7000", "127.0.0.2", 0),
        ("trainer", 0, "127.0.0.3:7001", "127.0.0.3", 0),
        ("trainer", 1, "", "127.0.0.3", 1),
        ("rollout", 0, "127.0.0.2:7002", "127.0.0.2", 1),
        ("rollout", 0, "10.0.0.9:7009", "", -1),  # joined through the registry: only its address is known
    ]
    assert describe(placements) == [
        "databuffer  127.0.0.2:7000  node 127.0.0.2  bundle 0",
        "trainer rank 0  127.0.0.3:7001  node 127.0.0.3  bundle 0  worker n1:0",
        "trainer rank 1  node 127.0.0.3  bundle 1  worker n1:1",
        "rollout  127.0.0.2:7002  node 127.0.0.2  bundle 1  devices 3",
        "rollout  10.0.0.9:7009",
    ]


def test_plain_processes_carry_their_addresses_only():
    rows = whereabouts({"databuffer": "127.0.0.1:1", "trainer": "127.0.0.1:2"}, {})
    assert describe([spb.Placement(**r) for r in rows]) == ["databuffer  127.0.0.1:1", "trainer  127.0.0.1:2"]
