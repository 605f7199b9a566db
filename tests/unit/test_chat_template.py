"""ChatTemplate: the standard variables, raise_exception, the sandbox, errors as BadRequest."""

from __future__ import annotations

import pytest

from cortex.errors import BadRequest
from cortex.profile.chat_template import ChatTemplate, TemplateError


def test_standard_variables_and_kwargs():
    t = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
        "{% if tools %}T{{ tools | length }}{{ tools[0] | tojson }}{% endif %}"
        "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}{{ extra }}"
    )
    msgs = [{"role": "user", "content": "héllo"}]
    out = t.render(msgs, bos_token="<s>", eos_token="</s>", tools=[{"n": "é"}],
                   extra={"extra": "!"})
    assert out == '<s>[user]hélloT1{"n": "é"}></s>!'
    assert t.render(msgs, add_generation_prompt=False) == "[user]héllo"
    # chat_template_kwargs cannot override the standard variables
    assert t.render(msgs, add_generation_prompt=False, extra={"messages": []}) == "[user]héllo"


def test_raise_exception_and_jinja_errors_are_bad_requests():
    t = ChatTemplate("{{ raise_exception('only user turns') }}")
    with pytest.raises(TemplateError, match="only user turns") as info:
        t.render([])
    assert isinstance(info.value, BadRequest) and info.value.http_status == 400
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages[0].content.upper() }}").render([])


def test_sandbox_blocks_unsafe_attributes_and_mutation():
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages.append(1) }}").render([])


def test_globals_render_as_in_a_fresh_sandbox_render():
    # The default namespace (range, dict, namespace, cycler, joiner) and raise_exception are
    # reachable exactly as in jinja2's own render, and globals do not leak between renders.
    source = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ m.role }}{% if loop.last %}!{% endif %}{% endfor %}{{ ns.n }}"
        "{% for i in range(2) %}{{ i }}{% endfor %}{{ dict(a=1) | tojson }}"
        "{% set c = cycler('x', 'y') %}{{ c.next() }}{{ c.next() }}"
        "{% set j = joiner('+') %}{{ j() }}a{{ j() }}b"
        "{% set late = 'L' %}{{ late }}{{ bos_token }}"
    )
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    t = ChatTemplate(source)
    first = t.render(msgs, bos_token="<s>")
    assert first == 'userassistant!201{"a": 1}xya+bL<s>'
    assert t.render(msgs, bos_token="<s>") == first
    assert t.render(msgs[:1]) == 'user!101{"a": 1}xya+bL'
    with pytest.raises(TemplateError, match="nope"):
        ChatTemplate("{{ raise_exception('nope') }}").render(msgs)


def test_render_equals_jinjas_own_render():
    # ChatTemplate.render builds the context and joins the root render function itself; it
    # must equal Template.render in the same sandbox, macros, blocks and kwargs included
    import json

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source = (
        "{% macro turn(m) %}<{{ m.role }}>{{ m.content | trim }}{% endmacro %}"
        "{% block head %}{{ bos_token }}{% if tools %}{{ tools | tojson }}{% endif %}"
        "{% endblock %}{% for m in messages %}{{ turn(m) }}{% if not loop.last %}|"
        "{% endif %}{% endfor %}{{ flavour | default('plain') }}"
        "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}"
    )
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent)
    reference = env.from_string(source)
    template = ChatTemplate(source)
    msgs = [{"role": "system", "content": " be brief "}, {"role": "user", "content": "hé"}]
    for extra in (None, {}, {"flavour": "spicy"}, {"bos_token": "ignored", "x": 1}):
        for generation in (True, False):
            for tools in (None, [{"name": "f"}]):
                expected = reference.render(
                    {**(extra or {}), "messages": msgs, "add_generation_prompt": generation,
                     "bos_token": "<s>", "eos_token": "</s>", "tools": tools})
                assert template.render(msgs, add_generation_prompt=generation, bos_token="<s>",
                                       eos_token="</s>", tools=tools, extra=extra) == expected
