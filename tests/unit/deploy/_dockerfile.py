"""Dockerfiles as stages of instructions, read with `dockerfile-parse`, and build-context ignore
files matched with the Docker SDK's own .dockerignore matcher; used by test_dockerfiles.py.
This file only groups what those libraries return; it parses nothing itself."""

from __future__ import annotations

import io
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from docker.utils.build import PatternMatcher
from dockerfile_parse import DockerfileParser


@dataclass
class Instruction:
    keyword: str  # FROM, COPY, RUN, ... (dockerfile-parse's "instruction")
    args: str  # dockerfile-parse's "value": the text after the keyword, continuations joined

    def flags_and_rest(self) -> tuple[dict[str, str], str]:
        """Leading `--flag=value` options (COPY --from=build, HEALTHCHECK --interval=5s) and the rest."""
        flags: dict[str, str] = {}
        rest = self.args.strip()
        while rest.startswith("--"):
            token, _, rest = rest.partition(" ")
            name, _, value = token[2:].partition("=")
            flags[name] = value
            rest = rest.lstrip()
        return flags, rest

    def words(self) -> list[str]:
        """Exec (JSON) form when the rest is a JSON array of strings, else shell words."""
        _, rest = self.flags_and_rest()
        if rest.startswith("["):
            return json.loads(rest)
        return shlex.split(rest)


@dataclass
class Stage:
    base: str  # the FROM image, build args substituted by dockerfile-parse
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parser(path: Path) -> DockerfileParser:
    """dockerfile-parse on an in-memory copy (its `path` argument wants a folder named Dockerfile's parent)."""
    return DockerfileParser(fileobj=io.BytesIO(Path(path).read_bytes()))


def instructions(path: Path) -> list[Instruction]:
    return [Instruction(i["instruction"], i["value"]) for i in parser(path).structure if i["instruction"] != "COMMENT"]


def stages(path: Path) -> list[Stage]:
    parsed = parser(path)
    out: list[Stage] = []
    for item in parsed.structure:
        if item["instruction"] == "FROM":
            words = item["value"].split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            out.append(Stage(parsed.parent_images[len(out)], name))
        elif out and item["instruction"] != "COMMENT":
            out[-1].instructions.append(Instruction(item["instruction"], item["value"]))
    return out


def copy_sources(inst: Instruction) -> tuple[dict[str, str], list[str], str]:
    """COPY/ADD -> (flags, sources, destination)."""
    flags, _ = inst.flags_and_rest()
    words = inst.words()
    return flags, words[:-1], words[-1]


def healthcheck_command(inst: Instruction) -> list[str]:
    """HEALTHCHECK [--options] CMD ... -> the command as a list."""
    _, rest = inst.flags_and_rest()
    return Instruction("CMD", rest.removeprefix("CMD").strip()).words()


class DockerIgnore:
    """A .dockerignore file, matched by the Docker SDK the way `docker build` matches it."""

    def __init__(self, text: str) -> None:
        patterns = [line.strip() for line in text.splitlines()]
        self.matcher = PatternMatcher([p for p in patterns if p and not p.startswith("#")])

    def excluded(self, path: str) -> bool:
        return self.matcher.matches(path)

    def included(self, path: str) -> bool:
        return not self.excluded(path)
