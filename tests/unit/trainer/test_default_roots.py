"""A standalone trainer or replica started without `paths.roots` accepts only paths inside its working
directory: a checkpoint, weight or staging path elsewhere, or one that climbs out with `..`, is refused
(PERMISSION_DENIED naming the setting); `paths.roots: []` still means anywhere, as an explicit choice."""

from __future__ import annotations

import pytest

from meshrl.common.errors import PermissionDenied
from meshrl.rollout.config import RolloutConfig
from meshrl.trainer.config import TrainerConfig


@pytest.mark.parametrize(
    "make", [lambda: TrainerConfig().paths, lambda: RolloutConfig(engine={"model_path": "m"}).paths]
)
def test_the_default_roots_are_the_working_directory(tmp_path, monkeypatch, make):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    roots = make()
    assert roots.inside(str(work / "weights" / "v000001"), "weights.path") == str(work / "weights" / "v000001")
    assert roots.inside("ckpt/step_1", "path") == str(work / "ckpt" / "step_1")
    for escaping in (str(tmp_path / "outside"), str(work / "weights" / ".." / ".." / "outside"), "../..", "/etc"):
        with pytest.raises(PermissionDenied, match="paths.roots") as info:
            roots.inside(escaping, "weights.path")
        assert info.value.field == "weights.path"
    anywhere = type(roots)(roots=[])
    assert anywhere.inside(str(tmp_path / "outside"), "path") == str(tmp_path / "outside")
