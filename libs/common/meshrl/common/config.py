"""Typed configuration loading for every service: defaults < YAML file < MESHRL_* env < --set overrides.

Config classes are pydantic models with `extra="forbid"`; `load_config` turns any
validation failure into a `ConfigError` naming the field, the bad value and the fix.
Each service's `__main__` calls `parse_service_args` to get its config from argv.

Why not a layering library: the typing and validation are pydantic's already; what is ours is ~60 lines of
layering (`deep_merge`, `env_overrides`, `parse_overrides`) and the error translation. pydantic-settings reads
nested env variables the same way but not `--set a.b=v` overrides, and it would spread one config over a
settings class per service with its own source order; OmegaConf brings a second type system and its own
interpolation beside pydantic's, and its errors name neither the closest known field nor the fix. The
translation (`to_config_error`: field path, value, "did you mean", the field's description as the fix) is
what users see, and no library gives it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pydantic
import yaml

from meshrl.common.bounded_yaml import load_bounded
from meshrl.common.errors import ConfigError
from meshrl.common.suggest import did_you_mean

T = TypeVar("T", bound=pydantic.BaseModel)
S = TypeVar("S", bound="Settings")
ENV_PREFIX = "MESHRL_"


class StrictModel(pydantic.BaseModel):
    """Base for config sections: unknown fields are errors, values are checked on assignment."""

    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)


class Settings(StrictModel):
    """A frozen group of settings that code builds directly (a request's loss, an optimizer): a bad value
    raises ConfigError naming `<section>.<field>`, the value and the fix, as a config file would."""

    model_config = pydantic.ConfigDict(frozen=True, validate_assignment=False)
    section: ClassVar[str] = ""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except pydantic.ValidationError as exc:
            raise to_config_error(type(self), exc, self.section) from None

    def over(self: S, fields: Mapping[str, Any]) -> S:
        """These settings with `fields` (e.g. the set fields of a request) laid over them, checked again."""
        return type(self)(**{**self.model_dump(), **fields})


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


def _parse_scalar(text: str) -> Any:
    try:
        return load_bounded(text, source="an override value")
    except yaml.YAMLError:
        return text


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """Turns ["a.b=1", "c=[1, 2]"] into a nested mapping; values are parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                item, item, "an override must look like key.path=value", "write e.g. --set server.port=50051"
            )
        _set_path(tree, key.strip(), _parse_scalar(value))
    return tree


def env_overrides(env: Mapping[str, str], prefix: str = ENV_PREFIX) -> dict[str, Any]:
    """MESHRL_SERVER__PORT=50051 -> {"server": {"port": 50051}} (double underscore separates levels)."""
    tree: dict[str, Any] = {}
    for name, value in env.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            dotted = name[len(prefix) :].lower().replace("__", ".")
            _set_path(tree, dotted, _parse_scalar(value))
    return tree


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError("--config", str(p), "the file does not exist", "pass the path of an existing YAML file")
    try:
        data = load_bounded(p.read_text(), source=str(p)) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(
            "--config", str(p), f"it is not valid YAML ({exc})", "fix the YAML syntax at that line"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError("--config", str(p), "the top level must be a mapping", "write `key: value` lines at the top")
    return data


def _field_names(model: type[pydantic.BaseModel], loc: Sequence[Any]) -> list[str]:
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return []
        current = fields[part].annotation
    return list(getattr(current, "model_fields", {}))


def _describe(model: type[pydantic.BaseModel], loc: Sequence[Any]) -> str | None:
    current: Any = model
    info = None
    for part in loc:
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return None
        info = fields[part]
        current = info.annotation
    return info.description if info else None


def to_config_error(model: type[pydantic.BaseModel], exc: pydantic.ValidationError, prefix: str = "") -> ConfigError:
    err = exc.errors()[0]
    loc = list(err["loc"])
    field = ".".join(str(p) for p in [*([prefix] if prefix else []), *loc]) or model.__name__
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        names = _field_names(model, loc)
        fix = did_you_mean(loc[-1], names, f"remove it; known fields here: {', '.join(names)}")
        return ConfigError(field, value, "unknown field", fix)
    if err["type"] == "missing":
        desc = _describe(model, loc)
        return ConfigError(
            field, None, "is required", f"set it ({desc})" if desc else "set it in the file or with --set"
        )
    desc = _describe(model, loc)
    fix = f"give {desc}" if desc else "give a value of the expected type"
    problem = err["msg"]
    if err["type"] == "value_error":  # a rule of the model's own: its message says what is wrong and how to fix it
        problem = problem.removeprefix("Value error, ")
        fix = fix if loc else "change the settings the message names"
    return ConfigError(field, value, problem, fix)


def section_defaults(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """What each section's default factory sets explicitly, e.g. {"server": {"port": 50051}}, so that
    overriding one field of a section (--set server.host=...) keeps the others' service defaults."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if info.default_factory is not None:
            value = info.default_factory()
            if isinstance(value, pydantic.BaseModel):
                out[name] = value.model_dump(exclude_unset=True)
    return out


def load_config(
    model: type[T],
    *,
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    base: Mapping[str, Any] | None = None,
    env_prefix: str = ENV_PREFIX,
) -> T:
    """Builds a config: model defaults < `base` < YAML file < environment < overrides."""
    data: dict[str, Any] = deep_merge(section_defaults(model), base or {})
    if path is not None:
        data = deep_merge(data, read_yaml(path))
    from_env = env_overrides(os.environ if env is None else env, env_prefix)
    # Only variables naming a section or field of this config count (MESHRL_AUTH_TOKEN is a secret, not a field).
    data = deep_merge(data, {k: v for k, v in from_env.items() if k in model.model_fields})
    data = deep_merge(data, parse_overrides(overrides))
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise to_config_error(model, exc) from None


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field, e.g. --set server.port=50051 (repeatable; MESHRL_SERVER__PORT works too)",
    )


def parse_service_args(model: type[T], argv: Sequence[str] | None, prog: str, description: str) -> T:
    """The argv handling shared by every service's `python -m meshrl.<svc>`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_config_arguments(parser)
    parser.add_argument("--port", type=int, help="shortcut for --set server.port=PORT")
    parser.add_argument("--host", help="shortcut for --set server.host=HOST (default 127.0.0.1: loopback only)")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.port is not None:
        overrides.append(f"server.port={args.port}")
    if args.host is not None:
        overrides.append(f"server.host={args.host}")
    try:
        return load_config(model, path=args.config, overrides=overrides)
    except ConfigError as exc:
        parser.exit(2, f"{prog}: error: {exc}\n")
