"""The error a workflow file raises when it is invalid: every problem found, each naming its node and the fix.

Raised by the workflow loader (`meshrl.scheduler.workflow.loader`) and by `resolve_executable`; it is an
`InvalidArgument`, so the job API maps it to INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshrl.common.errors import InvalidArgument


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a workflow. `node_id` is None for file-level problems (dag_id, YAML syntax)."""

    message: str
    fix: str
    node_id: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = f"node '{self.node_id}'" if self.node_id is not None else "workflow"
        return f"{where}: {self.message}. Fix: {self.fix}"


class WorkflowError(InvalidArgument):
    """A workflow file failed validation; `problems` lists every problem found, in file order."""

    def __init__(self, problems: Sequence[Problem], *, source: str = "workflow") -> None:
        if not problems:
            raise ValueError("WorkflowError needs at least one problem")
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.source = source
        if len(self.problems) == 1:
            text = f"{source} is invalid: {self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            text = f"{source} is invalid ({len(self.problems)} problems):\n{lines}"
        super().__init__(text, field=self.problems[0].field)

    @property
    def node_id(self) -> str | None:
        """The node of the first problem (None when it is about the file itself)."""
        return self.problems[0].node_id

    @property
    def fix(self) -> str:
        return self.problems[0].fix

    def node_ids(self) -> set[str | None]:
        return {p.node_id for p in self.problems}
