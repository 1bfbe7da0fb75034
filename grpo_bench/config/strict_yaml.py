"""YAML as the suite reads every user file: a repeated key is an error, and `1e-3` is a float.

PyYAML keeps the last of two equal keys without a word, so a second variant named `a`
replaced the first and a sweep ran one variant fewer than its file listed. Its YAML 1.1
resolver also reads `1e-3` (no dot, unsigned exponent) as a string, while every user and
YAML 1.2 mean the number. `load` fixes both; the error says where, as a dotted key.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, first: int, second: int):
        self.key, self.first, self.second = key, first, second
        super().__init__(f"{key}: duplicate key (lines {first} and {second}); YAML would keep only the last")


class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """SafeLoader that refuses duplicate mapping keys and resolves exponent floats without a dot. On libyaml's
    parser where PyYAML has it (the pure-Python one took a tenth of `findings`, which reads every claim's file);
    the checks and the resolver are Python either way."""

    def construct_document(self, node):
        self._check_unique(node, "", set())
        return super().construct_document(node)

    def _check_unique(self, node, path: str, seen: set) -> None:
        if id(node) in seen:  # an alias: the anchored node was checked where it stands
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=True) if key_node.tag != "tag:yaml.org,2002:merge" else "<<"
                dotted = f"{path}{key}"
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key (a mapping as a key): PyYAML reports it itself
                    first = None
                if first is not None:
                    raise DuplicateKey(dotted, first, key_node.start_mark.line + 1)
                try:
                    lines[key] = key_node.start_mark.line + 1
                except TypeError:
                    pass
                self._check_unique(value_node, dotted + ".", seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check_unique(item, f"{path}{i}.", seen)


# YAML 1.2's floats that YAML 1.1 leaves as strings: an exponent with no dot or no sign (1e-3, 3e2, 1E+5)
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load(text: str) -> Any:
    """The document in text; DuplicateKey (a yaml.YAMLError) names a repeated key as a dotted path."""
    return yaml.load(text, Loader=Loader)


def read_yaml(path: Path) -> Any:
    """A user's YAML file, or ConfigError naming it: unreadable, not UTF-8, invalid, or a key given twice."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(str(path), "<file>", e.strerror or str(e)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(str(path), f"line {line}", f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset "
                          f"{e.start}; save the file as UTF-8") from None
    try:
        return load(text)
    except DuplicateKey as e:
        raise ConfigError(str(path), e.key, f"duplicate key (lines {e.first} and {e.second}); "
                          "YAML would keep only the last") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "<file>"
        raise ConfigError(str(path), where, f"invalid YAML: {getattr(e, 'problem', e)}") from None
