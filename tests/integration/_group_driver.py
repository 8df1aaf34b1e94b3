"""`python -m tests.integration._group_driver RAY_ADDRESS MODEL BUFFER ROOT TP DP OUT`: a trainer group of
TP x DP ranks on a running Ray cluster, one rank per node (pinned by `placement.cluster_nodes`), that serves
the batch of `test_trainer_parallel.make_batch` (already in the data buffer under job 0): its log-probs, one SGD
step's metrics and the log-probs after it, and where each rank ran, written to OUT (JSON).

Its own process, as a Ray driver: Ray reads its auth mode when it is first imported (see the two-node tests).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray

from meshrl.scheduler.clients import TrainerClient
from meshrl.scheduler.config import OptimSection
from meshrl.scheduler.launch.placement import cluster_nodes
from meshrl.scheduler.launch.trainer_group import TrainerGroup
from tests.integration.test_trainer_parallel import SGD, served_logprobs, sgd_step


def main(address: str, model: str, buffer: str, root: str, tp: int, dp: int, out: str) -> None:
    ray.init(address=address, log_to_driver=False)
    nodes = cluster_nodes("CPU")
    world = tp * dp
    args = [
        "--set",
        f"databuffer_address={buffer}",
        "--set",
        f"parallel.tensor_parallel={tp}",
        "--set",
        f"data_parallel.size={dp}",
        "--set",
        "torch_threads=1",
        "--set",
        "databuffer_wait_seconds=0",
        "--set",
        f"paths.roots={json.dumps([root, str(Path(model).parent)])}",
    ]
    pins = [nodes[r % len(nodes)].pin() for r in range(world)]
    group = TrainerGroup(args, world, Path(root) / "logs", {"CPU": 1}, pins, timeout=180)
    try:
        trainer = TrainerClient(group.create(), timeout=300)
        trainer.load_model("actor", model, "float32", OptimSection(**SGD), 0)
        from meshrl.common.databuffer_client import DataBufferClient

        stack = {"buffer": DataBufferClient(buffer)}
        result = {
            "placements": [p.as_dict() for p in group.placements],
            "before": served_logprobs(stack, trainer, f"group{tp}x{dp}-0").tolist(),
            "metrics": sgd_step(trainer),
            "after": served_logprobs(stack, trainer, f"group{tp}x{dp}-1").tolist(),
        }
        Path(out).write_text(json.dumps(result))
    finally:
        group.teardown(grace=5)
        ray.shutdown()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], a[3], int(a[4]), int(a[5]), a[6])
