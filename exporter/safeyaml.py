"""YAML parsed with limits: nesting depth, aliases and what they expand to (boundedfile.py bounds the size).

The config and rules files are operator input, but a bad one must fail fast with one line, never
with a traceback, a RecursionError (PyYAML composes nodes recursively: 100,000 `[` or a 3000-deep
mapping overflow the stack) or gigabytes of memory (a 373-byte "billion laughs" file whose aliases
expand to 10^9 nodes). Every check runs on the event stream, which PyYAML produces without
recursion, before anything is composed or constructed.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, MappingEndEvent, NodeEvent, ScalarEvent, SequenceEndEvent
from yaml.nodes import Node

MAX_DEPTH = 64
MAX_ALIASES = 1000
MAX_EXPANDED_NODES = 200_000


class YamlLimitError(ValueError):
    """The file breaks a limit or is not YAML; the message is one line naming the file."""


def check_limits(text: str, source: str) -> None:
    """Walk the YAML event stream; YamlLimitError on too deep nesting, too many aliases or an alias bomb."""
    open_sizes: list[list[Any]] = []  # [expanded node count, anchor] per open collection
    anchored: dict[str, int] = {}
    aliases = 0
    total = 0
    try:
        # The pure-Python parser: it makes events without recursion (libyaml's binding recurses on 100,000 '[').
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, CollectionStartEvent):
                if len(open_sizes) >= MAX_DEPTH:
                    raise YamlLimitError(f"{source}{_line(event)}: nested deeper than {MAX_DEPTH} levels")
                open_sizes.append([1, event.anchor])
                continue
            if isinstance(event, MappingEndEvent | SequenceEndEvent):
                size, anchor = open_sizes.pop()
                if anchor is not None:
                    anchored[anchor] = size
                weight = size
            elif isinstance(event, AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise YamlLimitError(f"{source}{_line(event)}: more than {MAX_ALIASES} aliases")
                weight = anchored.get(event.anchor or "", 1)
                total += weight
            elif isinstance(event, ScalarEvent):
                if event.anchor is not None:
                    anchored[event.anchor] = 1
                weight = 1
                total += 1
            else:
                continue
            if open_sizes:
                open_sizes[-1][0] += weight
            if total > MAX_EXPANDED_NODES or (open_sizes and open_sizes[-1][0] > MAX_EXPANDED_NODES):
                raise YamlLimitError(
                    f"{source}{_line(event)}: aliases expand to more than {MAX_EXPANDED_NODES} values (an alias bomb?)"
                )
    except yaml.YAMLError:
        return  # not YAML at all: the caller's own parse reports it, in its own words


def safe_load(text: str, source: str) -> Any:
    check_limits(text, source)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise YamlLimitError(f"{source}{_mark(error)} is not valid YAML: {_problem(error)}") from error


def compose(text: str, source: str) -> Node | None:
    check_limits(text, source)
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        raise YamlLimitError(f"{source}{_mark(error)} is not valid YAML: {_problem(error)}") from error


def _line(event: NodeEvent | Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f" line {mark.line + 1}" if mark is not None else ""


def _mark(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    return f" line {mark.line + 1}" if mark is not None else ""


def _problem(error: yaml.YAMLError) -> str:
    problem = getattr(error, "problem", None) or str(error)
    return " ".join(str(problem).split())[:200]
