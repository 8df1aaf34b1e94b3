"""The `logging` section is checked when a job config loads (unknown backend, a backend named twice,
a backend whose extra is not installed: ConfigError naming the field, the value and the fix), and
the tracker fan-out keeps a job going when one tracker fails. Read-back of what each backend
writes: tests/integration/observability/test_trackers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrl.common.errors import ConfigError
from meshrl.scheduler.jobs import build_job_config
from meshrl.scheduler.trackers import Trackers, open_trackers
from meshrl.scheduler.trackers import config as tracker_config
from meshrl.scheduler.trackers.base import finite, flatten

BASE = "model: {path: m}\ndata: {train: t.jsonl}\n"


def _load(*overrides: str):
    return build_job_config(BASE, list(overrides))[0]


def test_no_backend_by_default():
    assert _load().logging.backends == []


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("logging.backends=[neptune]", ["logging.backends", "neptune", "tensorboard"]),
        ("logging.backends=[wandb,wandb]", ["logging.backends", "twice"]),
        ("logging.wandb_mode=cloud", ["logging.wandb_mode", "cloud"]),
    ],
)
def test_bad_logging_settings_name_the_field(override, words):
    with pytest.raises(ConfigError) as err:
        _load(override)
    for word in words:
        assert word in str(err.value)


def test_a_backend_that_is_not_installed_names_the_extra(monkeypatch):
    real = tracker_config.importlib.util.find_spec
    monkeypatch.setattr(
        tracker_config.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name)
    )
    with pytest.raises(ConfigError, match=r"meshrl-scheduler\[wandb\]"):
        _load("logging.backends=[wandb]")


class _Recorder:
    def __init__(self, name: str, fail_on: str = "") -> None:
        self.name, self.fail_on, self.seen = name, fail_on, []

    def log(self, step, metrics):
        if self.fail_on == "log":
            raise OSError("disk full")
        self.seen.append((step, metrics))

    def log_images(self, step, images):
        self.seen.append((step, sorted(images)))

    def close(self):
        self.seen.append("closed")


def test_a_failing_tracker_is_dropped_and_the_others_go_on(tmp_path):
    good, bad = _Recorder("good"), _Recorder("bad", fail_on="log")
    trackers = Trackers([bad, good])
    trackers.log(1, {"reward/mean": 0.5, "nan": float("nan"), "text": "x"})
    trackers.log(2, {"reward/mean": 0.75})
    (tmp_path / "curves.png").write_bytes(b"png")
    trackers.finish(2, [tmp_path / "curves.png", tmp_path / "missing.png"])
    assert good.seen == [(1, {"reward/mean": 0.5}), (2, {"reward/mean": 0.75}), (2, ["plots/curves"]), "closed"]
    assert bad.seen == [], "dropped at its first failure, never closed twice"
    assert trackers.trackers == []


def test_open_trackers_with_no_backend_opens_nothing(tmp_path):
    trackers = open_trackers(_load().logging, tmp_path, "job", {})
    assert trackers.trackers == []
    assert not list(Path(tmp_path).iterdir())


def test_helpers():
    assert finite({"a": 1, "b": float("inf"), "c": True, "d": 2.5}) == {"a": 1.0, "d": 2.5}
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {"a.b": "1", "a.c": "[1, 2]", "d": "None"}
