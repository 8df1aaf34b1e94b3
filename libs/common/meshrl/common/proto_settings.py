"""Settings messages with presence: a proto whose fields are `optional` scalars and enums (UNSPECIFIED = 0)
to and from plain mappings of the fields that are set.

The scheduler turns a job-config section into a request with `settings_to_proto` (a None field stays unset);
the service that owns the setting reads it back with `settings_from_proto` and lays it over its own defaults,
so a set zero is a zero and an unset field is the owner's default. Enum values travel as their names:
`POLICY_LOSS_PPO` <-> "ppo", `LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM` <-> "seq-mean-token-sum".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from meshrl.common.errors import InvalidArgument
from meshrl.common.suggest import did_you_mean


def _prefix(enum: EnumDescriptor) -> str:
    return enum.values_by_number[0].name[: -len("UNSPECIFIED")]


def enum_to_name(enum: EnumDescriptor, number: int) -> str:
    """The setting's name of an enum value: POLICY_LOSS_PPO -> "ppo"."""
    if number not in enum.values_by_number:
        raise InvalidArgument(f"{number} is not a value of {enum.name}")
    return enum.values_by_number[number].name[len(_prefix(enum)) :].lower().replace("_", "-")


def enum_names(enum: EnumDescriptor) -> list[str]:
    """Every setting name of an enum but UNSPECIFIED."""
    return [enum_to_name(enum, v.number) for v in enum.values if v.number != 0]


def name_to_enum(enum: EnumDescriptor, name: str, field: str) -> int:
    """ "ppo" -> POLICY_LOSS_PPO; an unknown name is refused with the known ones."""
    value = enum.values_by_name.get(_prefix(enum) + str(name).upper().replace("-", "_"))
    if value is None or value.number == 0:
        known = enum_names(enum)
        raise InvalidArgument(f"{field} = {name!r} is not valid: " + did_you_mean(name, known, f"use one of {known}"))
    return value.number


def settings_from_proto(message: Message) -> dict[str, Any]:
    """The fields of `message` that are set (enums by name); unset ones are absent."""
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_ENUM and value not in field.enum_type.values_by_number:
            known = ", ".join(enum_names(field.enum_type))
            raise InvalidArgument(
                f"{message.DESCRIPTOR.name}.{field.name} = {value} is not a value: use one of {known}"
            )
        out[field.name] = enum_to_name(field.enum_type, value) if field.type == FieldDescriptor.TYPE_ENUM else value
    return out


def settings_to_proto(cls: type[Message], values: Mapping[str, Any]) -> Message:
    """A `cls` message with the non-None `values` set (enum fields from their names)."""
    message = cls()
    fields = cls.DESCRIPTOR.fields_by_name
    for name, value in values.items():
        if value is None:
            continue
        if name not in fields:
            hint = did_you_mean(name, fields, f"known fields: {', '.join(fields)}")
            raise InvalidArgument(f"{cls.DESCRIPTOR.name} has no field {name!r}: {hint}")
        field = fields[name]
        if field.type == FieldDescriptor.TYPE_ENUM:
            value = name_to_enum(field.enum_type, value, f"{cls.DESCRIPTOR.name}.{name}")
        setattr(message, name, value)
    return message


def optional_field(message: Message, name: str) -> Any:
    """The value of `optional` field `name`, or None when it is not set."""
    return getattr(message, name) if message.HasField(name) else None
