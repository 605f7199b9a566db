"""What an engine reads from a model's directory besides ``tokenizer.json``, read the same way.

vLLM and SGLang load a model's tokenizer with ``transformers`` from the model directory. The
files that change the prompt text a request becomes (transformers 4.4x-5.x) are:

* ``tokenizer_config.json``:
  - the named special tokens ``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``,
    ``pad_token``, ``cls_token``, ``mask_token``: each a string, an added-token object
    (``{"content": ..., "lstrip": ...}``, ``"__type": "AddedToken"`` in older files) or null.
    ``apply_chat_template`` hands every one that is set to the template as a variable of that
    name (``special_tokens_map``), under the request's own ``chat_template_kwargs``;
  - ``add_bos_token`` / ``add_eos_token``: whether text tokenized with special tokens gets them.
    transformers 5 drops both when a ``tokenizer.json`` exists (its post-processor decides)
    and builds a post-processor from them only for a ``tokenizer.json`` without one; they are
    kept here as stated, and ``model_profile`` applies that rule;
  - ``chat_template``: a string, or a list of ``{"name", "template"}`` (named templates).
* ``special_tokens_map.json`` (legacy): named special tokens the config does not set.
* ``chat_template.jinja`` (the default template) and ``additional_chat_templates/<name>.jinja``:
  when any exists they replace the config's ``chat_template`` (transformers >= 4.49).

Template choice is HF's ``get_chat_template``: a single template always; among named ones
``tool_use`` when the request has tools (``tools`` not null) and the model has it, else
``default`` (no default: the model has no usable template here).

Pure apart from reading the files (no I/O framework); every problem is collected, not raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"


@dataclass(frozen=True, slots=True)
class HfSettings:
    """A model directory's tokenizer settings; empty when the directory has none of the files."""

    special_tokens: dict[str, str] = field(default_factory=dict)
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
    chat_templates: dict[str, str] = field(default_factory=dict)  # name -> Jinja source
    templates_from: str | None = None  # the file(s) the templates were read from


def token_text(value: object) -> str | None:
    """A special token as a config writes it: a string, an added-token object, or null."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def named_templates(value: object) -> dict[str, str]:
    """A config's ``chat_template`` value as ``{name: source}`` (a lone string is ``default``);
    ``ValueError`` for anything else."""
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return dict(value)
    if isinstance(value, list) and all(
            isinstance(entry, dict) and isinstance(entry.get("name"), str)
            and isinstance(entry.get("template"), str) for entry in value):
        return {entry["name"]: entry["template"] for entry in value}
    raise ValueError("chat_template must be a string or a list of {name, template}")


def pick_template(templates: dict[str, str], tools: bool) -> str | None:
    """The template HF's ``get_chat_template`` uses (``None``: no usable one)."""
    if len(templates) == 1:
        return next(iter(templates.values()))
    if tools and "tool_use" in templates:
        return templates["tool_use"]
    return templates.get("default")


def read_hf_settings(directory: Path, problems: list[str]) -> HfSettings:
    """The settings of the model directory ``directory`` (missing files are simply absent)."""
    config = _read_json(directory / CONFIG_FILE, problems)
    legacy = _read_json(directory / SPECIAL_TOKENS_MAP_FILE, problems)
    special: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = token_text(config.get(name)) if name in config else token_text(legacy.get(name))
        if text is not None:
            special[name] = text
    templates: dict[str, str] = {}
    templates_from: str | None = None
    template_file = directory / TEMPLATE_FILE
    extra = sorted((directory / TEMPLATE_DIR).glob("*.jinja")) \
        if (directory / TEMPLATE_DIR).is_dir() else []
    try:
        if template_file.is_file() or extra:
            if template_file.is_file():
                templates["default"] = template_file.read_text(encoding="utf-8")
            for path in extra:
                templates[path.stem] = path.read_text(encoding="utf-8")
            templates_from = str(template_file if template_file.is_file() else extra[0])
        elif config.get("chat_template") is not None:
            templates = named_templates(config["chat_template"])
            templates_from = str(directory / CONFIG_FILE)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problems.append(f"chat template in {directory}: {exc}")
    return HfSettings(special, _flag(config, "add_bos_token", problems),
                      _flag(config, "add_eos_token", problems), templates, templates_from)


def _flag(config: dict[str, Any], name: str, problems: list[str]) -> bool | None:
    value = config.get(name)
    if value is None or isinstance(value, bool):
        return value
    problems.append(f"{CONFIG_FILE}: {name} must be true or false, not {value!r}")
    return None


def _read_json(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problems.append(f"{path}: {exc}")
        return {}
    if not isinstance(value, dict):
        problems.append(f"{path}: not a JSON object")
        return {}
    return value
