"""User functions named by a workflow's `executable_ref` ("package.module:function"): the allow-list check
and the import.

The loader calls `check_executable` for every COMPUTE node at load time; the step executor calls
`resolve_executable` to get the function it runs. A workflow file may arrive over the job API, and
importing a module runs its code, so the module must lie under one of the allowed prefixes BEFORE anything
is imported. The default allows only meshrl's own modules; a deployment adds its users' packages
(e.g. `my_rewards`) explicitly (argument or $MESHRL_ALLOWED_MODULES), or "*" to allow anything.
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable, Sequence
from typing import Any

from meshrl.common.suggest import did_you_mean
from meshrl.scheduler.workflow.errors import Problem, WorkflowError

DEFAULT_ALLOWED_MODULES: tuple[str, ...] = ("meshrl",)
ALLOW_ALL = "*"
ALLOWED_MODULES_ENV = "MESHRL_ALLOWED_MODULES"


def default_allowed_modules() -> tuple[str, ...]:
    """$MESHRL_ALLOWED_MODULES (comma-separated prefixes, "*" for any) or meshrl's own modules."""
    value = os.environ.get(ALLOWED_MODULES_ENV, "")
    prefixes = tuple(p.strip() for p in value.split(",") if p.strip())
    return prefixes or DEFAULT_ALLOWED_MODULES


class _RefProblem(Exception):
    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


def split_ref(ref: str) -> tuple[str, str]:
    """'pkg.mod:fn' -> ('pkg.mod', 'fn'). The format itself is checked by the Node model."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise _RefProblem(f"executable_ref '{ref}' is not 'package.module:function'", "write e.g. my_rewards:score")
    return module, attr


def module_allowed(module: str, allowed: Sequence[str]) -> bool:
    """True when `module` equals an allowed prefix or lies inside it (whole dotted components only)."""
    for prefix in allowed:
        prefix = prefix.strip().rstrip(".")
        if prefix == ALLOW_ALL or module == prefix or module.startswith(prefix + "."):
            return True
    return False


def _check_allowed(ref: str, allowed: Sequence[str]) -> tuple[str, str]:
    module_name, attr_path = split_ref(ref)
    if not module_allowed(module_name, allowed):
        shown = ", ".join(allowed) if allowed else "(none)"
        raise _RefProblem(
            f"executable_ref '{ref}': module '{module_name}' is outside the allowed modules [{shown}]",
            f"add '{module_name.split('.')[0]}' (or the exact module) to the allowed executable modules "
            "(workflow allowed_modules / meshrl plan --allow-module) if you trust it",
        )
    return module_name, attr_path


def _load(ref: str, allowed: Sequence[str]) -> Callable[..., Any]:
    module_name, attr_path = _check_allowed(ref, allowed)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise _RefProblem(
            f"executable_ref '{ref}': module '{module_name}' cannot be imported ({exc})",
            "check the spelling and that the module is installed or on PYTHONPATH of the scheduler",
        ) from exc
    except Exception as exc:  # the module exists but raises while importing
        raise _RefProblem(
            f"executable_ref '{ref}': importing '{module_name}' raised {type(exc).__name__}: {exc}",
            "fix the error in that module (import it in a Python shell to see the traceback)",
        ) from exc
    walked = module_name
    for part in attr_path.split("."):
        if part.startswith("_"):
            raise _RefProblem(f"executable_ref '{ref}' names a private attribute '{part}'", "name a public function")
        if not hasattr(target, part):
            names = [n for n in dir(target) if not n.startswith("_")]
            hint = did_you_mean(part, names, f"define '{part}' in {walked}", template=walked + ":{}")
            raise _RefProblem(f"executable_ref '{ref}': '{walked}' has no attribute '{part}'", hint)
        target = getattr(target, part)
        walked = f"{walked}.{part}"
        if isinstance(target, types.ModuleType):
            raise _RefProblem(
                f"executable_ref '{ref}' walks into module '{target.__name__}'",
                f"name the function's own module: {target.__name__}:FUNCTION",
            )
    defined_in = getattr(target, "__module__", None) or module_name
    if not module_allowed(defined_in, allowed):
        raise _RefProblem(
            f"executable_ref '{ref}' is defined in '{defined_in}', which is outside the allowed modules",
            f"reference a function defined under an allowed module, or allow '{defined_in.split('.')[0]}'",
        )
    if not callable(target):
        raise _RefProblem(
            f"executable_ref '{ref}' names a {type(target).__name__}, not a function",
            "point it at a function taking the node's inputs",
        )
    return target


def check_executable(
    ref: str, allowed: Sequence[str], node_id: str | None = None, *, import_module: bool = True
) -> Problem | None:
    """Returns the problem with `ref` (not allowed, not importable, not callable), or None when it is fine.

    With `import_module=False` only the allow-list is checked (nothing is imported).
    """
    try:
        if import_module:
            _load(ref, allowed)
        else:
            _check_allowed(ref, allowed)
    except _RefProblem as exc:
        return Problem(exc.message, exc.fix, node_id=node_id, field="executable_ref")
    return None


def resolve_executable(
    ref: str, allowed_modules: Sequence[str] | None = None, node_id: str | None = None
) -> Callable[..., Any]:
    """Imports and returns the function named by `ref` (allow-list: `allowed_modules` or the default);
    raises WorkflowError naming the node and the fix."""
    try:
        return _load(ref, default_allowed_modules() if allowed_modules is None else allowed_modules)
    except _RefProblem as exc:
        raise WorkflowError([Problem(exc.message, exc.fix, node_id=node_id, field="executable_ref")]) from exc
