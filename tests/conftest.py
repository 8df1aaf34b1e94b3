"""Layers of the suite: every test is marked by its folder (`unit`, `integration`, `e2e`, `faults`) and runs in
that order, so `pytest -m "not e2e and not faults"` is the fast loop and a broken unit fails before the long
jobs start."""

from __future__ import annotations

from pathlib import Path

import pytest

LAYERS = ("unit", "integration", "e2e", "faults")
_ROOT = Path(__file__).parent


def _layer(item: pytest.Item) -> str | None:
    try:
        part = Path(str(item.path)).relative_to(_ROOT).parts[0]
    except ValueError:
        return None
    return part if part in LAYERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        layer = _layer(item)
        if layer is not None:
            item.add_marker(getattr(pytest.mark, layer))
    order = {name: i for i, name in enumerate(LAYERS)}
    items.sort(key=lambda item: order.get(_layer(item) or "", len(LAYERS)))  # stable: file order within a layer
