"""``dump_toml``: the configuration tree written back as TOML (a tiny emitter, no dependency).

Rules:

* Every key is written, so the output is the complete effective configuration, and loading it
  gives back an equal ``CortexConfig`` (secrets aside: masked ones come back as ``"***"``).
* ``None`` is written ``"none"`` for non-string optional fields and ``""`` for string ones, the
  spellings the loader reads as ``None``. An optional key whose value and default are both
  ``None`` is written as a comment, which loads as the same default.
* Sections become ``[a.b]`` tables, lists of entries ``[[name]]`` arrays of tables.
* ``comments=True`` writes each section's and key's meaning (``docs``) above it: that is how the
  example ``packaging/cortex.toml`` is made.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import textwrap
from typing import Any

from cortex.config.docs import DOCS, SECTIONS
from cortex.config.tree import CortexConfig
from cortex.config.walk import is_section, list_item, optional_inner, type_hints

MASK = "***"


def dump_toml(config: CortexConfig, mask_secrets: bool = True, comments: bool = False) -> str:
    lines: list[str] = []
    _table(config, (), lines, mask_secrets, comments, array=False)
    return "\n".join(lines).strip("\n") + "\n"


def _table(obj: Any, path: tuple[str, ...], lines: list[str], mask: bool, comments: bool,
           array: bool) -> None:
    hints = type_hints(type(obj))
    specs = dataclasses.fields(obj)
    scalars = [spec for spec in specs
               if not is_section(hints[spec.name]) and list_item(hints[spec.name]) is None]
    if path:
        lines.append("")
        doc_key = ".".join(path)
        if comments and doc_key in SECTIONS and not array:
            lines.extend(_comment(SECTIONS[doc_key]))
        lines.append(f"[[{doc_key}]]" if array else f"[{doc_key}]")
    for spec in scalars:
        value = getattr(obj, spec.name)
        doc_key = ".".join((*path, spec.name))
        if comments and doc_key in DOCS:
            lines.extend(_comment(DOCS[doc_key]))
        tp = hints[spec.name]
        if value is None and _default(spec) is None:
            lines.append(f"# {spec.name} = {_none(tp)}  (not set)")
            continue
        if mask and spec.metadata.get("secret") and value is not None:
            value = MASK
        lines.append(f"{spec.name} = {_value(value, tp)}")
    for spec in specs:
        tp = hints[spec.name]
        if is_section(tp):
            _table(getattr(obj, spec.name), (*path, spec.name), lines, mask, comments, False)
    for spec in specs:
        if list_item(hints[spec.name]) is None:
            continue
        name = ".".join((*path, spec.name))
        entries = getattr(obj, spec.name)
        if comments and name in SECTIONS:
            lines.extend(("", *_comment(SECTIONS[name])))
        if not entries:
            lines.extend(("", f"# [[{name}]]  (none configured)"))
        for entry in entries:
            _table(entry, (*path, spec.name), lines, mask, comments, True)


def _comment(text: str) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(text, 96)]


def _default(spec: dataclasses.Field[Any]) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return dataclasses.MISSING


def _none(tp: Any) -> str:
    return '""' if optional_inner(tp) is str else '"none"'


def _value(value: Any, tp: Any) -> str:
    if value is None:
        return _none(tp)
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"cannot write {value!r} as TOML")
