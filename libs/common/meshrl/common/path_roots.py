"""File roots of a service: every path a caller names in an RPC (a model folder, a checkpoint, published
weights, a staging folder) is resolved and must lie inside one of the configured roots, or it is refused.

The trainer's and the rollout's servicers call `PathRoots.inside` at the edge; the scheduler sets the roots
of the services it launches to the run folder and the model folder.
A standalone trainer or replica (`python -m meshrl.trainer` / `meshrl.rollout`) defaults to its working
directory (`.`, `PathRoots.working_folder()`); deployments set `paths.roots`. An empty list of roots means
"anywhere": an explicit choice (and the in-process default of `PathRoots()`, for tests and embedding).
"""

from __future__ import annotations

from pathlib import Path

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.errors import InvalidArgument, PermissionDenied


class PathRoots(StrictModel):
    roots: list[str] = pydantic.Field(
        default_factory=list,
        description="folders that every path named in a call must lie in (model, checkpoint, weights, staging "
        "folders); relative ones are resolved against the working directory; empty = anywhere",
    )

    @classmethod
    def working_folder(cls) -> PathRoots:
        """A standalone service's default: only the folder it runs in (not the whole file system)."""
        return cls(roots=["."])

    def inside(self, path: str, field: str) -> str:
        """`path` resolved (symlinks and `..` followed); PERMISSION_DENIED when outside every root."""
        if not path:
            raise InvalidArgument(f"{field} is empty: name a folder", field=field)
        if "\x00" in path:
            raise InvalidArgument(f"{field} contains a NUL byte", field=field)
        resolved = Path(path).expanduser().resolve()
        if not self.roots:
            return str(resolved)
        for root in self.roots:
            base = Path(root).expanduser().resolve()
            if resolved == base or base in resolved.parents:
                return str(resolved)
        raise self._outside(path, field)

    def target(self, path: str, field: str) -> str:
        """A folder a call creates or replaces: inside a root (as `inside`) and never a root itself."""
        resolved = self.inside(path, field)
        if any(Path(resolved) == Path(root).expanduser().resolve() for root in self.roots or ["/"]):
            raise PermissionDenied(
                f"{field} {path!r} is one of this service's roots (or /): a call may create or replace a folder "
                "inside a root, not the root itself. Fix: name a sub-folder",
                field=field,
            )
        return resolved

    def _outside(self, path: str, field: str) -> PermissionDenied:
        shown = path if len(path) <= 200 else path[:200] + "..."
        return PermissionDenied(
            f"{field} {shown!r} lies outside this service's roots {self.roots}. "
            "Fix: name a path inside one of them, or add its folder to the service's paths.roots",
            field=field,
        )
