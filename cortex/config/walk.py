"""The one generic walk over the configuration tree, driven by the fields' type annotations.

Rules:

* Supported field types: ``int``, ``float``, ``bool``, ``str``, ``X | None``, ``Literal[...]``,
  ``enum.Enum``, a nested dataclass, and ``tuple[Dataclass, ...]`` (a list of entries).
* A raw tree is nested dicts as TOML gives them. A leaf is either a native TOML value or a
  ``Text`` (a value spelled as text: environment, flag, ``--worker`` mini-syntax), which is
  parsed according to the field's type. ``Text`` remembers where it came from for messages.
* ``None`` is spelled ``""`` for every optional field, and also ``"none"`` for optional fields
  that are not strings (TOML has no null).
* ``build`` never stops at the first problem: it appends every problem (unknown key with a
  "did you mean", wrong type with its key path, a section's own ``ConfigError`` problems,
  ``validate()`` problems) to ``problems`` and returns ``None`` for a part it could not build,
  whose parent then keeps its default so that its other fields are still checked; a list
  keeps the entries that did build, so checks across entries still see them.
* ``scalar_keys`` lists every scalar key (a path of field names) with its type and default: the
  environment variables and flags are generated from it, so each key has both.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import math
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cortex.errors import ConfigError

_MISSING = object()
_NONE_WORDS = ("none", "null")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True, slots=True)
class Text:
    """A value written as text, parsed by the type of the field it lands in."""

    value: str
    origin: str  # e.g. "env CORTEX_SERVER_PORT", "--server-port", "--worker #2"


@dataclass(frozen=True, slots=True)
class ScalarKey:
    path: tuple[str, ...]
    type: Any
    default: Any
    secret: bool


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def optional_inner(tp: Any) -> Any | None:
    """``X`` for ``X | None``, else ``None``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        if len(inner) == 1 and len(typing.get_args(tp)) == 2:
            return inner[0]
    return None


def list_item(tp: Any) -> type | None:
    """The entry dataclass of ``tuple[X, ...]`` / ``list[X]``, else ``None``."""
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        args = [arg for arg in typing.get_args(tp) if arg is not Ellipsis]
        if len(args) == 1 and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def scalar_keys(cls: type, prefix: tuple[str, ...] = (), default: Any = _MISSING
                ) -> Iterator[ScalarKey]:
    """Every scalar key under ``cls``, depth first in field order (lists are not scalars)."""
    hints = type_hints(cls)
    for spec in dataclasses.fields(cls):
        tp = hints[spec.name]
        path = (*prefix, spec.name)
        value = _field_default(spec) if default is _MISSING else getattr(default, spec.name)
        if is_section(tp):
            yield from scalar_keys(tp, path, value)
        elif list_item(tp) is None:
            yield ScalarKey(path, tp, value, bool(spec.metadata.get("secret")))


def _field_default(spec: dataclasses.Field[Any]) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return _MISSING


def suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def build(cls: type, raw: Any, key: str, problems: list[str]) -> Any:
    """An instance of ``cls`` from ``raw`` (a mapping), or ``None`` with ``problems`` added."""
    if not isinstance(raw, Mapping):
        problems.append(f"{key or 'config'}: expected a table, got {_show(raw)}{_from(raw)}")
        return None
    hints = type_hints(cls)
    specs = {spec.name: spec for spec in dataclasses.fields(cls)}
    for name in raw:
        if name not in specs:
            problems.append(f"unknown key {_join(key, name)}{suggest(name, list(specs))}"
                            f"{_from(raw[name])}")
    kwargs: dict[str, Any] = {}
    missing = []
    for name, spec in specs.items():
        if name in raw:
            ok, value = convert(raw[name], hints[name], _join(key, name), problems)
            if ok or isinstance(value, tuple):  # (a list keeps its good entries for the
                kwargs[name] = value  # other checks; its problems are reported already)
            elif _field_default(spec) is _MISSING:
                missing.append(name)
        elif _field_default(spec) is _MISSING:
            problems.append(f"{_join(key, name)} is required")
            missing.append(name)
    if missing:
        return None
    try:
        instance = cls(**kwargs)
    except ConfigError as error:
        problems.extend(f"{key}: {problem}" if key else problem for problem in error.problems)
        return None
    validate = getattr(instance, "validate", None)
    if callable(validate):
        found = validate()
        if found:
            problems.extend(f"{key}: {problem}" if key else problem for problem in found)
            return None
    return instance


def convert(value: Any, tp: Any, key: str, problems: list[str]) -> tuple[bool, Any]:
    """``(True, typed value)`` or ``(False, None)`` with a problem added."""
    inner = optional_inner(tp)
    if inner is not None:
        text = value.value if isinstance(value, Text) else value
        if isinstance(text, str) and (
                text == "" or (inner is not str and text.strip().lower() in _NONE_WORDS)):
            return True, None
        return convert(value, inner, key, problems)
    item = list_item(tp)
    if item is not None:
        if not isinstance(value, list):
            problems.append(f"{key}: expected a list of tables, got {_show(value)}{_from(value)}")
            return False, None
        built = [build(item, entry, f"{key}[{index}]", problems)
                 for index, entry in enumerate(value)]
        good = tuple(entry for entry in built if entry is not None)
        return len(good) == len(built), good
    if is_section(tp):
        built = build(tp, value, key, problems)
        return built is not None, built
    try:
        return True, _scalar(value, tp)
    except ValueError as error:
        problems.append(f"{key}: {error}{_from(value)}")
        return False, None


def _scalar(value: Any, tp: Any) -> Any:
    text = value.value.strip() if isinstance(value, Text) else None
    if typing.get_origin(tp) is typing.Literal:
        allowed = typing.get_args(tp)
        candidate = text if text is not None else value
        if isinstance(candidate, str):  # "INFO" is "info"
            candidate = next((choice for choice in allowed if isinstance(choice, str)
                              and choice.lower() == candidate.lower()), candidate)
        if candidate not in allowed:
            raise ValueError(f"must be one of {', '.join(map(repr, allowed))}, "
                             f"not {_show(candidate)}")
        return candidate
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        candidate = text if text is not None else value
        for member in tp:
            if candidate == member.value or (
                    isinstance(candidate, str) and candidate.lower() == member.name.lower()):
                return member
        raise ValueError(f"must be one of {', '.join(repr(m.value) for m in tp)}, "
                         f"not {_show(candidate)}")
    if tp is bool:
        if text is not None:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
        elif isinstance(value, bool):
            return value
        raise ValueError(f"expected true or false, got {_show(text if text is not None else value)}")
    if tp is int:
        if text is not None:
            try:
                return int(text)
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"expected an integer, got {_show(text if text is not None else value)}")
    if tp is float:
        number = None
        if text is not None:
            try:
                number = float(text)
            except ValueError:
                pass
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        if number is None or math.isnan(number):
            raise ValueError(
                f"expected a number, got {_show(text if text is not None else value)}")
        return number
    if tp is str:
        if isinstance(value, Text):
            return value.value
        if isinstance(value, str):
            return value
        raise ValueError(f"expected a string, got {_show(value)}")
    raise TypeError(f"configuration field type {tp!r} is not supported")


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _show(value: Any) -> str:
    if isinstance(value, Text):
        value = value.value
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _from(value: Any) -> str:
    return f" (from {value.origin})" if isinstance(value, Text) else ""
