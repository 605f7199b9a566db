"""The README's "Quick start without a GPU" runs end to end as written
(``tests/readme_quick_start``): two ``cortex sim`` engines serving the built-in DeepSeek profile
by default, ``cortex serve`` with ``builtin=deepseek``, and a chat request sent twice whose
second answer reports a cache hit — with the venv's ``cortex`` (the one-file binary's smoke
test runs the same lines)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.readme_quick_start import check_cache_hit_on_second_send, run_quick_start

pytestmark = pytest.mark.slow

CORTEX = Path(sys.executable).parent / "cortex"  # the console script pip installed


async def test_the_readme_quick_start_answers_with_a_cache_hit_on_the_second_send():
    assert CORTEX.is_file(), f"{CORTEX}: install Cortex into this environment (pip install -e .)"
    check_cache_hit_on_second_send(await run_quick_start(CORTEX, timeout_s=120))
