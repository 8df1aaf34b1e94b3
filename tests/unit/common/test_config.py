"""Typed config: precedence of file, environment and overrides; errors that name field, value and fix."""

import pydantic
import pytest

from meshrl.common.config import StrictModel, load_config, parse_overrides
from meshrl.common.errors import ConfigError


class Redis(StrictModel):
    url: str | None = None
    ttl_seconds: int = pydantic.Field(3600, gt=0, description="a positive number of seconds")


class Cfg(StrictModel):
    name: str = "x"
    redis: Redis = pydantic.Field(default_factory=Redis)


def test_precedence_defaults_file_env_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: from-file\nredis:\n  ttl_seconds: 10\n")
    cfg = load_config(Cfg, path=path, env={"MESHRL_REDIS__TTL_SECONDS": "20"}, overrides=["name=cli"])
    assert (cfg.name, cfg.redis.ttl_seconds) == ("cli", 20)
    assert load_config(Cfg, path=path, env={}).redis.ttl_seconds == 10


def test_bad_value_names_field_value_and_fix():
    with pytest.raises(ConfigError) as info:
        load_config(Cfg, env={}, overrides=["redis.ttl_seconds=-5"])
    text = str(info.value)
    assert "redis.ttl_seconds" in text and "-5" in text and "Fix: give a positive number of seconds" in text


def test_unknown_field_suggests_the_close_name():
    with pytest.raises(ConfigError, match="did you mean 'ttl_seconds'"):
        load_config(Cfg, env={}, overrides=["redis.ttl_secnds=5"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Cfg, path=tmp_path / "nope.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Cfg, path=bad, env={})


def test_override_syntax_error():
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_overrides(["novalue"])
    assert parse_overrides(["a.b=[1, 2]", "c=true"]) == {"a": {"b": [1, 2]}, "c": True}


def test_environment_variables_that_are_not_fields_are_ignored():
    cfg = load_config(Cfg, env={"MESHRL_AUTH_TOKEN": "secret", "MESHRL_NAME": "env"})
    assert cfg.name == "env"


def test_overriding_one_field_keeps_the_section_defaults():
    class Server(StrictModel):
        host: str = "127.0.0.1"
        port: int = 0

    class Svc(StrictModel):
        server: Server = pydantic.Field(default_factory=lambda: Server(port=50050))

    cfg = load_config(Svc, env={}, overrides=["server.host=0.0.0.0"])
    assert (cfg.server.host, cfg.server.port) == ("0.0.0.0", 50050)
