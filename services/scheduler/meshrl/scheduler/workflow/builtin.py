"""The built-in workflows shipped in `meshrl/scheduler/workflows/*.yaml` (grpo, ppo, dapo, reinforce_pp, rloo).

Called by the job API and the CLI (`workflow_name` / `meshrl run grpo`), and by `meshrl plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from meshrl.common.errors import NotFound
from meshrl.common.suggest import did_you_mean
from meshrl.scheduler.workflow.loader import load_workflow_file, load_workflow_text
from meshrl.scheduler.workflow.model import Workflow

_PACKAGE = "meshrl.scheduler"
_FOLDER = "workflows"


def _folder() -> Any:
    return resources.files(_PACKAGE).joinpath(_FOLDER)


def builtin_names() -> tuple[str, ...]:
    """The names of the built-in workflows, sorted."""
    return tuple(sorted(p.name[: -len(".yaml")] for p in _folder().iterdir() if p.name.endswith(".yaml")))


def builtin_workflow_text(name: str) -> str:
    """The YAML text of built-in workflow `name`; NotFound (with the known names) when there is none."""
    names = builtin_names()
    if name not in names:
        fix = did_you_mean(name, names, otherwise=f"use one of {', '.join(names)} or a workflow file path")
        raise NotFound(f"there is no built-in workflow '{name}'. Fix: {fix}")
    return _folder().joinpath(f"{name}.yaml").read_text()


def load_builtin(
    name: str, config: Any = None, *, allowed_modules: Sequence[str] | None = None, import_executables: bool = True
) -> Workflow:
    """Loads and validates built-in workflow `name` against the job's global `config`."""
    return load_workflow_text(
        builtin_workflow_text(name),
        config,
        allowed_modules=allowed_modules,
        import_executables=import_executables,
        source=f"built-in workflow '{name}'",
    )


def load_workflow(
    spec: str | Path,
    config: Any = None,
    *,
    allowed_modules: Sequence[str] | None = None,
    import_executables: bool = True,
) -> Workflow:
    """`spec` is a path to a workflow file, or the name of a built-in workflow."""
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return load_workflow_file(path, config, allowed_modules=allowed_modules, import_executables=import_executables)
    return load_builtin(str(spec), config, allowed_modules=allowed_modules, import_executables=import_executables)
