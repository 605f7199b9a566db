"""Render a chat template (Jinja) the way HF ``apply_chat_template`` / vLLM / SGLang do.

Variables, lowest precedence first: the model's named special tokens (``constants``:
``bos_token``, ``eos_token``, ``pad_token``, ... as ``hf_settings`` reads them — HF's
``special_tokens_map``), then the ``extra`` mapping (``chat_template_kwargs``), then the
standard ``messages``, ``add_generation_prompt``, ``tools`` and ``documents`` (``None`` when
absent). Globals ``raise_exception`` (raises ``TemplateError``) and ``strftime_now``. Rendering
runs in jinja2's ``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks`` and
the ``loopcontrols`` extension (``break``/``continue``), and a ``tojson`` filter with HF's
arguments (non-ASCII kept by default, ``indent``, ``separators``, ``sort_keys``), as HF's
environment has them. Any rendering failure (Jinja, or a template indexing a message that is not
there) is a ``TemplateError`` (400).

``ChatTemplates`` holds a model's templates and picks one per request as HF's
``get_chat_template`` does (``hf_settings.pick_template``): ``tool_use`` for a request with
tools when the model names one, else the default.

Pure: compile once (``ChatTemplate(source)``), render many times (the template's globals
flattened into one dict at compile time: the same names and objects, a cheaper copy per render;
the render builds its context and joins the template's root render function itself, as
``Template.render`` does, with two frames and a dict copy less; an error is not rewritten into
a template traceback, which nothing here reads).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from cortex.errors import BadRequest
from cortex.prompt.render_cache import (
    Locality,
    RenderCache,
    TracedMessages,
    locality,
    traced_loop_context,
)

log = logging.getLogger("cortex.profile")


class TemplateError(BadRequest):
    """The template cannot render this conversation (``raise_exception`` or a Jinja error)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class ChatTemplate:
    """``cache``: the template's ``RenderCache`` when it is shown to render messages locally
    (``render_cache.locality``), else ``None``, ``not_local`` says why and ``renders`` counts
    the conversations rendered whole."""

    __slots__ = ("_loop_context", "_template", "cache", "not_local", "renders", "source")

    def __init__(self, source: str, constants: Mapping[str, str] | None = None) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        self.source = source
        tree = env.parse(source)  # jinja2.TemplateSyntaxError on bad source
        self._template = env.from_string(tree)  # compiled from the tree read below, once
        # The template's globals are a ChainMap over the environment's; every render copies them
        # into its context, and copying a ChainMap is most of a small chat's render time (11.9
        # µs → 4.4 µs flat for the DeepSeek template). Flattening once is exact: nothing adds
        # globals after this point (the environment is private to this template). The sandbox
        # is unchanged: it checks attribute access and calls, not where globals live.
        # The special tokens join them: constants of the model, under ``chat_template_kwargs``
        # (HF: ``{**special_tokens_map, **kwargs}``).
        self._template.globals = {**self._template.globals, **(constants or {})}
        shape = locality(tree)
        self.not_local = shape if isinstance(shape, str) else None
        self.renders = 0  # whole renders of a template without a cache (``chat_prompt``)
        self.cache = RenderCache(shape) if isinstance(shape, Locality) else None
        self._loop_context = isinstance(shape, Locality) and shape.loop_context
        if self._loop_context:  # this template's own module namespace: no other is touched
            self._template.root_render_func.__globals__["LoopContext"] = (
                traced_loop_context(LoopContext))

    def render(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, object]] | None = None,
        documents: Sequence[Mapping[str, object]] | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> str:
        parts: list[str] = []
        self._render_into(parts, messages, add_generation_prompt, tools, documents, extra)
        return "".join(parts)

    def render_traced(self, messages: Sequence[Mapping[str, object]],
                      **variables: Any) -> tuple[str, TracedMessages]:
        """``render``'s text (same keywords), and the ``TracedMessages`` it rendered (where
        each message's output starts); for a template with a ``cache`` only."""
        traced = TracedMessages(messages, in_iter=not self._loop_context)
        self._render_into(traced.parts, traced, **variables)
        return traced.finish(), traced

    def _render_into(self, parts: list[str], messages: Sequence[Mapping[str, object]],
                     add_generation_prompt: bool = True,
                     tools: Sequence[Mapping[str, object]] | None = None,
                     documents: Sequence[Mapping[str, object]] | None = None,
                     extra: Mapping[str, object] | None = None) -> None:
        """Extend ``parts`` with the output (in C: a traced render counts them as it goes)."""
        try:
            parts.extend(self._generate(messages, add_generation_prompt, tools, documents,
                                        extra))
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError) as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc

    def _generate(self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool,
                  tools: Sequence[Mapping[str, object]] | None,
                  documents: Sequence[Mapping[str, object]] | None,
                  extra: Mapping[str, object] | None) -> Iterator[str]:
        template = self._template
        # What ``Template.render(variables)`` does, in one frame: the context's variables are
        # the template's globals (special tokens among them), then ``chat_template_kwargs``,
        # then the standard variables (each wins over the ones before it, as
        # ``dict(globals, **vars)`` makes them).
        variables = {**template.globals, **extra} if extra else template.globals.copy()
        variables["messages"] = messages
        variables["add_generation_prompt"] = add_generation_prompt
        variables["tools"] = tools
        variables["documents"] = documents
        environment = template.environment
        context = environment.context_class(environment, variables, template.name,
                                            template.blocks, globals=template.globals)
        return template.root_render_func(context)


class ChatTemplates:
    """A model's chat templates: ``default`` (``None`` when the model names templates but no
    default) and ``tool_use`` (the one for requests with tools: the model's ``tool_use``
    template, else the default)."""

    __slots__ = ("default", "tool_use")

    def __init__(self, default: ChatTemplate | None, tool_use: ChatTemplate | None) -> None:
        self.default = default
        self.tool_use = tool_use

    def use_render_cache(self, capacity_bytes: int, model: str) -> None:
        """Bound each template's render cache to ``capacity_bytes`` (0: keep nothing); says
        once, per template shown not to render messages locally, why it renders whole."""
        for template in self.distinct():
            if template.cache is not None:
                template.cache.capacity_bytes = capacity_bytes
            else:
                log.info("model %s: its chat template renders every conversation whole (%s)",
                         model, template.not_local)

    def distinct(self) -> list[ChatTemplate]:
        """The model's templates, each once (``tool_use`` is often ``default`` itself)."""
        return list({id(t): t for t in (self.default, self.tool_use) if t is not None}.values())

    def pick(self, tools: object) -> ChatTemplate | None:
        """The template for a request whose ``tools`` is ``tools`` (HF: tools not null)."""
        return self.default if tools is None else self.tool_use
