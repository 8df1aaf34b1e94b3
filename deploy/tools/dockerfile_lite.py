"""Reads Dockerfiles and .dockerignore files the way BuildKit does, for checks that need no Docker engine.

Used by tests/unit/deploy/test_dockerfiles.py (COPY sources exist and survive the ignore file,
entry points and health checks are real, the final stage runs as a non-root user). Handles line
continuations, comments, parser directives, global and per-stage ARG substitution, exec (JSON)
and shell forms, and the flags of FROM/COPY/HEALTHCHECK.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ARG_REF = re.compile(r"\$\{(\w+)(?::?[-+][^}]*)?\}|\$(\w+)")


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, COPY, RUN, ...
    args: str  # the raw text after the keyword, continuations joined
    line: int  # 1-based line of the keyword

    def flags_and_rest(self) -> tuple[dict[str, str], str]:
        """Splits leading `--flag=value` options (COPY --from=build, HEALTHCHECK --interval=5s) from the rest."""
        flags: dict[str, str] = {}
        rest = self.args.strip()
        while rest.startswith("--"):
            token, _, rest = rest.partition(" ")
            name, _, value = token[2:].partition("=")
            flags[name] = value
            rest = rest.lstrip()
        return flags, rest

    def words(self) -> list[str]:
        """The arguments as a list: JSON (exec) form when it parses as a JSON array, else shell words."""
        _, rest = self.flags_and_rest()
        if rest.startswith("["):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
        return shlex.split(rest)


@dataclass
class Stage:
    base: str  # the FROM image with ARGs substituted
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse_instructions(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue  # comments and parser directives (# syntax=...) between instructions
        if buffer and stripped.startswith("#"):
            continue  # a comment line inside a continued instruction is dropped
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1].strip())
            continue
        buffer.append(stripped)
        line = " ".join(part for part in buffer if part)
        buffer = []
        keyword, _, args = line.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    if buffer:
        raise ValueError(f"line {start}: the file ends inside a continued instruction")
    return out


def substitute(text: str, values: dict[str, str]) -> str:
    return ARG_REF.sub(lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def _arg_default(inst: Instruction) -> tuple[str, str | None]:
    name, sep, default = inst.args.partition("=")
    return name.strip(), default.strip().strip('"') if sep else None


def parse_dockerfile(path: Path) -> list[Stage]:
    """Splits a Dockerfile into stages; FROM lines get their global ARG defaults substituted."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for inst in parse_instructions(path.read_text()):
        if inst.keyword == "ARG" and not stages:
            name, default = _arg_default(inst)
            if default is not None:
                global_args[name] = default
            continue
        if inst.keyword == "FROM":
            flags, rest = inst.flags_and_rest()
            parts = rest.split()
            base = substitute(parts[0], global_args)
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
            continue
        if not stages:
            raise ValueError(f"{path}:{inst.line}: {inst.keyword} before the first FROM")
        stages[-1].instructions.append(inst)
    return stages


def copy_sources(inst: Instruction) -> tuple[dict[str, str], list[str], str]:
    """(flags, sources, destination) of a COPY or ADD."""
    flags, _ = inst.flags_and_rest()
    words = inst.words()
    return flags, words[:-1], words[-1]


class DockerIgnore:
    """Matches paths against .dockerignore rules: last matching rule wins, `!` re-includes, a rule
    that matches a folder matches everything inside it, `**` spans folders."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line[1:].strip() if negate else line
            self.rules.append((negate, self._compile(pattern.strip("/"))))

    @staticmethod
    def _compile(pattern: str) -> re.Pattern[str]:
        parts = []
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                parts.append("(?:.*/)?")
                i += 3
            elif pattern.startswith("**", i):
                parts.append(".*")
                i += 2
            elif pattern[i] == "*":
                parts.append("[^/]*")
                i += 1
            elif pattern[i] == "?":
                parts.append("[^/]")
                i += 1
            else:
                parts.append(re.escape(pattern[i]))
                i += 1
        return re.compile("^" + "".join(parts) + "(?:/.*)?$")

    def excluded(self, path: str) -> bool:
        path = path.strip("/")
        verdict = False
        for negate, rule in self.rules:
            if rule.match(path):
                verdict = not negate
        return verdict

    def included(self, path: str) -> bool:
        return not self.excluded(path)


def healthcheck_command(inst: Instruction) -> list[str] | None:
    """The command of `HEALTHCHECK [--opts] CMD ...` (None for HEALTHCHECK NONE)."""
    _, rest = inst.flags_and_rest()
    keyword, _, command = rest.partition(" ")
    if keyword.upper() != "CMD":
        return None
    return Instruction("CMD", command, inst.line).words()
