"""Disaggregated placement on one host's CPUs (`services.cpu_placement`): which cores the launched trainer and
each rollout replica get, and the service specs that carry it. A placed spec carries its cores in
`CPU_CORES_ENV` (ServiceProcess sets the process's CPU affinity from it as it starts, so every thread it makes
stays there), OpenMP / MKL thread counts equal to its cores, and the service's torch thread setting. The rest of
the job (the data buffer, and the scheduler's job thread with every thread and reward worker it starts) goes
on the cores `others` names (`pin_thread`). Called by JobServices.open (launch/services.py) and `meshrl plan`,
which shows the sets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from meshrl.common.errors import ConfigError
from meshrl.scheduler.config.cpu_placement import CpuPlacement

CPU_CORES_ENV = "MESHRL_CPU_CORES"


@dataclass(frozen=True)
class CpuSets:
    """The cores of the trainer (its ranks share them), of each replica in replica order, and of the rest of the
    job (the scheduler's work and the data buffer; None: not placed)."""

    trainer: tuple[int, ...]
    replicas: tuple[tuple[int, ...], ...]
    others: tuple[int, ...] | None = None

    def of(self, name: str) -> tuple[int, ...] | None:
        """The cores of a launched service by instance name ('trainer', 'rollout-<i>'); None: not placed."""
        if name == "trainer":
            return self.trainer
        if name.startswith("rollout-") and self.replicas:
            return self.replicas[int(name.removeprefix("rollout-")) % len(self.replicas)]
        if name == "databuffer":
            return self.others
        return None

    def describe(self) -> str:
        rows = [("trainer", self.trainer), *((f"rollout-{i}", c) for i, c in enumerate(self.replicas))]
        lines = [f"  {name:<11} cores {_ranges(cores)} ({len(cores)} torch threads)" for name, cores in rows]
        where = _ranges(self.others) if self.others is not None else "any"
        return "\n".join([*lines, f"  {'the rest':<11} cores {where} (the scheduler's job thread, the data buffer)"])

    def as_dict(self) -> dict:
        out = {"trainer": list(self.trainer), "replicas": [list(c) for c in self.replicas]}
        return {**out, "others": list(self.others) if self.others is not None else None}


def host_cores() -> list[int]:
    """The cores this process may run on (its affinity: a container's or taskset's limit, not every core)."""
    return sorted(os.sched_getaffinity(0))


def cpu_sets(placement: CpuPlacement, replicas: int, available: list[int] | None = None) -> CpuSets:
    """Splits `available` (default: host_cores()) between the trainer and `replicas` replicas: the named cores,
    or contiguous blocks in the shares' proportions (each side at least one core). The replicas split their
    cores in equal blocks when there are enough, else share them all. Raises ConfigError when a named core is
    not on this host or the host has too few cores for two sides."""
    available = sorted(available if available is not None else host_cores())
    if placement.trainer_cores is not None:
        for side, cores in (("trainer_cores", placement.trainer_cores), ("rollout_cores", placement.rollout_cores)):
            missing = sorted(set(cores) - set(available))
            if missing:
                raise ConfigError(
                    f"services.cpu_placement.{side}",
                    cores,
                    f"cores {missing} are not cores this host lets the job use ({_ranges(available)})",
                    f"name cores among {_ranges(available)}, or give trainer_share / rollout_share instead",
                )
        trainer, rollout = tuple(sorted(placement.trainer_cores)), tuple(sorted(placement.rollout_cores))
    else:
        if len(available) < 2:
            raise ConfigError(
                "services.cpu_placement",
                placement.model_dump(exclude_none=True),
                f"this host lets the job use {len(available)} core ({_ranges(available)}): nothing to split",
                "drop services.cpu_placement on a one-core host",
            )
        share = placement.trainer_share / (placement.trainer_share + placement.rollout_share)
        count = min(max(round(len(available) * share), 1), len(available) - 1)
        trainer, rollout = tuple(available[:count]), tuple(available[count:])
    others = {"rollout": rollout, "trainer": trainer, "any": None}[placement.others]
    return CpuSets(trainer, _blocks(rollout, replicas), others)


def placed(spec, sets: CpuSets, engine: str = "transformers", trainer_ranks: int = 1):
    """`spec` (a launcher ServiceSpec) pinned to its cores with thread counts to match (the data buffer on the
    cores of `others`); unchanged when it has no cores in `sets`. Its own thread settings come first, so the job's
    service_overrides still win."""
    cores = sets.of(spec.name)
    if cores is None:
        return spec
    threads = len(cores)
    if spec.service == "trainer":
        threads = max(1, len(cores) // max(1, trainer_ranks))
        first = ["--set", f"torch_threads={threads}"]
    elif spec.service == "rollout" and engine == "transformers":
        first = ["--set", f"engine.transformers.num_threads={threads}"]
    else:  # the data buffer, or an engine server of its own (vLLM, SGLang): inherits the affinity, sizes itself
        first = []
    env = {
        **spec.env,
        CPU_CORES_ENV: ",".join(map(str, cores)),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }
    return replace(spec, args=[*first, *spec.args], env=env)


def pin_thread(cores: tuple[int, ...] | None) -> set[int] | None:
    """Puts the calling thread (and every thread and process it starts from now on) on `cores`; returns the
    cores it had, for `unpin_thread`. None: leaves it where it is."""
    if cores is None:
        return None
    before = os.sched_getaffinity(0)  # pid 0: this thread only, not the whole process
    os.sched_setaffinity(0, set(cores))
    return before


def unpin_thread(before: set[int] | None) -> None:
    """Gives the calling thread back the cores `pin_thread` took it from."""
    if before is not None:
        os.sched_setaffinity(0, before)


def parse_cores(value: str) -> set[int]:
    """CPU_CORES_ENV's value ('0,1') as a set of core numbers."""
    try:
        return {int(part) for part in value.split(",") if part.strip()}
    except ValueError:
        raise ConfigError(CPU_CORES_ENV, value, "is not a comma-separated list of core numbers", "e.g. 0,1") from None


def _blocks(cores: tuple[int, ...], count: int) -> tuple[tuple[int, ...], ...]:
    if count <= 0:
        return ()
    if len(cores) < count:
        return tuple(cores for _ in range(count))
    size, extra = divmod(len(cores), count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        out.append(cores[start:end])
        start = end
    return tuple(out)


def _ranges(cores) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    cores = sorted(cores)
    if not cores:
        return "none"
    parts, start = [], cores[0]
    for prev, cur in zip(cores, [*cores[1:], None]):
        if cur is None or cur != prev + 1:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(parts)
