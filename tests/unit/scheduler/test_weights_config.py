"""weights.delta / weights.max_delta_fraction are checked at load, and the errors name the field (the
refit of a replica that refuses a delta runs through real services in tests/integration/test_weight_publication.py)."""

import pytest

from meshrl.common.config import load_config
from meshrl.common.errors import ConfigError
from meshrl.scheduler.config import WeightsSection


def test_delta_goes_on_either_transport_with_a_fraction_in_range():
    assert WeightsSection(delta=True).max_delta_fraction == 0.5
    cfg = load_config(WeightsSection, env={}, overrides=["delta=true", "transport=distributed"])
    assert cfg.delta and cfg.transport == "distributed"
    with pytest.raises(ConfigError, match="max_delta_fraction"):
        load_config(WeightsSection, env={}, overrides=["delta=true", "max_delta_fraction=1.5"])
