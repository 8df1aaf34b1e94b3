"""The weight group's rendezvous lives on the trainer's host: its address, a configured port, or a
free port picked there when that host is this machine's; otherwise a clear error naming the field."""

import pytest

from meshrl.common.errors import ConfigError
from meshrl.scheduler.config import WeightsSection
from meshrl.scheduler.fleet.weight_sync import rendezvous


def test_the_rendezvous_is_on_the_trainers_host():
    host, port = rendezvous("127.0.0.3:50052", WeightsSection())
    assert host == "127.0.0.3" and port > 0
    assert rendezvous("127.0.0.3:50052", WeightsSection(group_port=29500)) == ("127.0.0.3", 29500)
    assert rendezvous("127.0.0.3:1", WeightsSection(group_address="127.0.0.4", group_port=7)) == ("127.0.0.4", 7)


def test_a_remote_trainer_without_a_configured_port_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        rendezvous("meshrl-trainer.invalid:50052", WeightsSection())
    assert info.value.field == "weights.group_port" and "29500" in str(info.value)
