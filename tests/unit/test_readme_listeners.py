"""The README's configuration section states where both planes listen by default, as the
configuration's defaults say (the data plane binds every interface unless told otherwise)."""

from __future__ import annotations

from pathlib import Path

from cortex.config.tree import ControlConfig, ServerConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n### {title}\n")
    end = text.find("\n### ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_configuration_section_states_both_default_binds():
    text = " ".join(section("Configuration").split())
    server, control = ServerConfig(), ControlConfig()
    assert f"`server.host:server.port`, by default `{server.host}:{server.port}`" in text
    assert f"`control.host:control.port` ({control.host}:{control.port})" in text
