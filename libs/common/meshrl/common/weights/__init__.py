"""The weight plane: publishing trainer weights to rollout replicas, on disk or over a collective.

Shared by the trainer (sender) and the rollout service (receivers); imports torch, which
meshrl-common lists only as the optional `torch` extra, so nothing outside this package may
import it. Public API:

disk:        write_version, read_version, load_version, stage_to_local, gc_versions, list_versions
             (disk.py, loading.py; file format in safetensors_io.py and manifest.py)
apply:       apply_to_state (all-or-nothing, in place), InPlaceSink / CallbackSink / WeightSink
collective:  WeightGroup.join(...).send(...) / .receive(...), WeightGroupOptions,
             GroupSpec, GroupPlan (rank offsets, re-planning), MembersUnresponsive, UpdateRefused
             (collective.py; bucket wire format in wire.py, store keys in rendezvous.py,
             backends and deadlines in transport.py)
delta:       DeltaBase + write_delta (trainer), stage_delta + apply_delta (replica), BaseMismatch
             (delta.py; file format in delta_manifest.py, encoding in delta_codec.py);
             over a weight group: delta_update (trainer), DeltaOrFullSink (replica) (delta_wire.py)
checksums:   tensor_checksums, sample_names, compare_checksums, to_proto
"""

from .apply import apply_to_state
from .buckets import DEFAULT_BUCKET_BYTES, iter_buckets
from .checksums import compare_checksums, sample_names, tensor_checksum, tensor_checksums, to_proto
from .collective import WeightGroup, WeightGroupOptions
from .delta import DeltaBase, DeltaStats, StagedDelta, apply_delta, stage_delta, write_delta
from .delta_wire import WIRE_NAMES as DELTA_WIRE_NAMES
from .delta_wire import DeltaOrFullSink, delta_update
from .disk import VersionReader, gc_versions, list_versions, read_manifest, read_version, write_version
from .errors import BaseMismatch, MembersUnresponsive, UpdateOutcome, UpdateRefused
from .group_plan import GroupPlan, GroupSpec
from .loading import load_version, stage_to_local
from .sink import CallbackSink, InPlaceSink, WeightSink

__all__ = [
    "BaseMismatch",
    "DeltaBase",
    "DeltaOrFullSink",
    "DELTA_WIRE_NAMES",
    "DeltaStats",
    "StagedDelta",
    "apply_delta",
    "delta_update",
    "stage_delta",
    "write_delta",
    "DEFAULT_BUCKET_BYTES",
    "CallbackSink",
    "GroupPlan",
    "GroupSpec",
    "InPlaceSink",
    "MembersUnresponsive",
    "UpdateOutcome",
    "UpdateRefused",
    "VersionReader",
    "WeightGroup",
    "WeightGroupOptions",
    "WeightSink",
    "apply_to_state",
    "compare_checksums",
    "gc_versions",
    "iter_buckets",
    "list_versions",
    "load_version",
    "read_manifest",
    "read_version",
    "sample_names",
    "stage_to_local",
    "tensor_checksum",
    "tensor_checksums",
    "to_proto",
    "write_version",
]
