"""ChatTemplate: the standard variables, the model's special tokens, HF's globals, filters and
extensions, raise_exception, the sandbox, errors as BadRequest; ChatTemplates' choice."""

from __future__ import annotations

import pytest

from cortex.errors import BadRequest
from cortex.prompt.chat_template import ChatTemplate, ChatTemplates, TemplateError


def test_standard_variables_and_kwargs():
    source = ("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
              "{% if tools %}T{{ tools | length }}{{ tools[0] | tojson }}{% endif %}"
              "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}{{ extra }}"
              "{% if documents %}D{{ documents | length }}{% endif %}")
    t = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    msgs = [{"role": "user", "content": "héllo"}]
    out = t.render(msgs, tools=[{"n": "é"}], extra={"extra": "!"}, documents=[{"t": 1}])
    assert out == '<s>[user]hélloT1{"n": "é"}></s>!D1'
    assert t.render(msgs, add_generation_prompt=False) == "<s>[user]héllo</s>"
    assert ChatTemplate(source).render(msgs, add_generation_prompt=False) == "[user]héllo"
    # chat_template_kwargs cannot override the standard variables, but do override the special
    # tokens (HF: {**special_tokens_map, **kwargs})
    assert t.render(msgs, add_generation_prompt=False, extra={"messages": []}) \
        == "<s>[user]héllo</s>"
    assert t.render(msgs, add_generation_prompt=False, extra={"bos_token": "B"}) \
        == "B[user]héllo</s>"


def test_hf_globals_filters_and_loop_controls():
    t = ChatTemplate(
        "{% for m in messages %}{% if m.skip %}{% continue %}{% endif %}{{ m.content }}"
        "{% if m.stop %}{% break %}{% endif %}{% endfor %}|"
        "{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=True) }}|"
        "{{ {'a': [1, 2]} | tojson(indent=2) }}|{{ {'a': 'é'} | tojson(ensure_ascii=True) }}|"
        "{{ {'a': 1, 'b': 2} | tojson(separators=(',', ':')) }}|{{ strftime_now('%Y') | length }}")
    msgs = [{"content": "a"}, {"content": "x", "skip": True}, {"content": "b", "stop": True},
            {"content": "c"}]
    assert t.render(msgs) == ('ab|{"a": "é", "b": 1}|{\n  "a": [\n    1,\n    2\n  ]\n}|'
                              '{"a": "\\u00e9"}|{"a":1,"b":2}|4')


def test_templates_pick_tool_use_only_for_requests_with_tools():
    default, tool_use = ChatTemplate("d"), ChatTemplate("t")
    templates = ChatTemplates(default, tool_use)
    assert templates.pick(None) is default
    assert templates.pick([]) is tool_use and templates.pick([{"x": 1}]) is tool_use
    assert ChatTemplates(None, tool_use).pick(None) is None


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
    t = ChatTemplate(source, {"bos_token": "<s>"})
    first = t.render(msgs)
    assert first == 'userassistant!201{"a": 1}xya+bL<s>'
    assert t.render(msgs) == first
    assert ChatTemplate(source).render(msgs[:1]) == 'user!101{"a": 1}xya+bL'
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
    template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    msgs = [{"role": "system", "content": " be brief "}, {"role": "user", "content": "hé"}]
    for extra in (None, {}, {"flavour": "spicy"}, {"bos_token": "kwarg wins", "x": 1}):
        for generation in (True, False):
            for tools in (None, [{"name": "f"}]):
                expected = reference.render(
                    {"bos_token": "<s>", "eos_token": "</s>", **(extra or {}),
                     "messages": msgs, "add_generation_prompt": generation, "tools": tools,
                     "documents": None})
                assert template.render(msgs, add_generation_prompt=generation, tools=tools,
                                       extra=extra) == expected
