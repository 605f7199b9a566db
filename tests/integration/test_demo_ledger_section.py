"""``make demo``'s second section (``cortex.demo.ledger_section``): simulated engines publishing
with faults injected, every ledger compared with its engine's cache and matched prompts printed.
The routing section runs processes and is the replay's (``test_replay_quick``); this one runs in
process, short."""

from __future__ import annotations

import pytest

from cortex.demo import ledger_section


async def test_the_demos_ledger_section_finds_every_ledger_exact(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert await ledger_section(seconds=1.0)
    out = capsys.readouterr().out
    assert "ledger equals every engine's cache" in out
    assert "match(prompt)" in out
