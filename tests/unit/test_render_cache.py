"""``render_cache``: which templates are shown to render messages locally (and how far each
message looks), which are not and why; a negative index read at render time turns the cache
off; the cache stays within its bytes and counts what it did."""

from __future__ import annotations

import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from cortex.prompt.chat_messages import engine_messages
from cortex.prompt.chat_template import ChatTemplate
from cortex.prompt.render_cache import Locality, RenderCache, locality


def _shape(source: str) -> Locality | str:
    env = ImmutableSandboxedEnvironment(extensions=[jinja2.ext.loopcontrols])
    return locality(env.parse(source))


LOOP = "{% for message in messages %}{{ message.content }}{% endfor %}"


@pytest.mark.parametrize(("source", "left", "right", "loop_context"), [
    (LOOP, 0, 0, False),
    ("{{ messages[0].content }}" + LOOP + "{% if add_generation_prompt %}>{% endif %}",
     0, 0, False),
    ("{% for m in messages %}{% if loop.first %}F{% endif %}{{ m.content }}"
     "{% if loop.last %}L{% endif %}{% endfor %}", 0, 0, True),
    ("{% for m in messages %}{% if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool'"
     " %}<{% endif %}{% if not loop.last and messages[loop.index0 + 2].role %}>{% endif %}"
     "{% endfor %}", 1, 2, True),
    ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('alternate') }}{% endif %}{% endfor %}", 0, 0, True),
    ("{% for m in messages %}{{ loop.previtem }}{% set x = m.content %}{{ x }}{% endfor %}",
     1, 0, True),
    ("{% for m in messages %}{{ messages[loop.index].content }}{% endfor %}", 0, 1, True),
    ("{% for m in messages %}{% for c in m.tool_calls %}{{ loop.index0 }}{% endfor %}"
     "{% endfor %}", 0, 0, False),
])
def test_local_templates_and_how_far_a_message_looks(source, left, right, loop_context):
    assert _shape(source) == Locality(left, right, loop_context)


@pytest.mark.parametrize(("source", "why"), [
    ("{{ messages|length }}" + LOOP, "read whole"),
    ("{{ messages[-1].content }}" + LOOP, "index other than"),
    ("{% for m in messages[1:] %}{{ m }}{% endfor %}", "single top-level loop"),
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
     "{% endfor %}", "namespace"),
    ("{% for m in messages %}{{ loop.index }}{% endfor %}", "as a number"),
    ("{% for m in messages %}{{ loop.length }}{% endfor %}", "length"),
    ("{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}{% endfor %}",
     "break"),
    ("{{ strftime_now('%d') }}" + LOOP, "time"),
    (LOOP + LOOP, "single top-level loop"),
    ("{% if true %}" + LOOP + "{% endif %}", "single top-level loop"),
    ("{% for m in messages if m.role != 'system' %}{{ m }}{% endfor %}", "filters"),
    ("{% for m in messages %}{{ messages[loop.index0 * 2] }}{% endfor %}", "index other"),
    ("{% for m in messages %}{% for c in m.calls %}{{ messages[loop.index0] }}{% endfor %}"
     "{% endfor %}", "index other"),
    ("{% for m in messages %}{{ foo(loop) }}{% endfor %}", "loop object"),
    ("{% include 'x' %}" + LOOP, "include"),
    ("{% set ns = namespace(n=0) %}{% macro count() %}{% set ns.n = ns.n + 1 %}{% endmacro %}"
     "{% for m in messages %}{{ count() }}{{ ns.n }}{% endfor %}", "macro"),
    ("{% set c = cycler('a', 'b') %}{% for m in messages %}{{ c.next() }}{% endfor %}",
     "cycler"),
    ("{% for m in messages %}{{ [1, 2]|random }}{% endfor %}", "random"),
])
def test_templates_not_shown_local_say_why(source, why):
    shape = _shape(source)
    assert isinstance(shape, str) and why in shape, shape


def test_a_template_not_shown_local_has_no_cache():
    template = ChatTemplate("{{ messages|length }}" + LOOP)
    assert template.cache is None and "read whole" in template.not_local


def _render_with(template: ChatTemplate, messages: list[dict]) -> tuple[str, dict] | None:
    assert template.cache is not None
    return template.cache.render(messages, None, engine_messages, template.render_traced,
                                 template.render)


def test_a_negative_index_at_render_time_turns_the_cache_off():
    # index0 - 1 at the first message reads the last one: not local, found while rendering
    template = ChatTemplate("{% for m in messages %}{{ messages[loop.index0 - 1].content }}"
                            "{% endfor %}")
    messages = [{"role": "user", "content": str(i)} for i in range(6)]
    assert _render_with(template, messages) is None
    assert template.cache.off is not None and template.cache.cached_bytes == 0
    assert _render_with(template, [*messages, {"role": "user", "content": "x"}]) is None
    assert template.cache.renders["fallback"] == 2


def test_media_is_left_to_the_full_render():
    template = ChatTemplate(LOOP)
    media = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert _render_with(template, media) is None
    assert template.cache.renders["fallback"] == 1


def test_the_cache_keeps_within_its_bytes_and_counts():
    template = ChatTemplate(LOOP)
    template.cache = RenderCache(template.cache.shape, capacity_bytes=4000)
    template.cache.window_s_per_byte = 0.0
    for conversation in range(20):
        messages = [{"role": "user", "content": f"{conversation}-{i}" * 20} for i in range(8)]
        for grown in range(4, 9):
            text, last = _render_with(template, messages[:grown])
            assert text == template.render(messages[:grown]) and last == messages[grown - 1]
            assert template.cache.cached_bytes <= 4000
    assert template.cache.renders["window"] > 0 and template.cache.renders["full"] >= 20
    with pytest.raises(ValueError):
        RenderCache(template.cache.shape, capacity_bytes=-1)
