"""The Makefile's long runs print as they go (issue 33 §4): with ``--output-sync=target`` GNU make
holds a target's output until the target ends, except on a recipe line it takes for a
recursive one (marked ``+``) — so the lines that run the test suite and the demo carry ``+``,
each long set-up step says at once that it started (``$(SAY)``, a ``+@echo``), and pytest lists
the slowest tests. Read from the Makefile's text: running ``make -n`` would run every ``+`` line.
"""

from __future__ import annotations

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def recipes() -> dict[str, list[str]]:
    """Target -> its recipe lines (tabs stripped), for plain ``target: prerequisites`` rules."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in MAKEFILE.read_text().splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line[1:])
            continue
        rule = re.match(r"^([A-Za-z$()_.-][^:=\s]*)\s*:(?!=)", line)
        current = found.setdefault(rule.group(1), []) if rule else None
    return found


def test_parallel_setup_keeps_each_steps_output_together():
    text = MAKEFILE.read_text()
    assert re.search(r"^MAKEFLAGS \+= .*--jobs=2 .*--output-sync=target", text, re.MULTILINE)
    assert re.search(r"^SAY := \+@echo", text, re.MULTILINE)
    assert re.search(r"^DURATIONS := --durations=\d+", text, re.MULTILINE)


def test_the_test_runs_and_the_demo_are_never_held_back():
    rules = recipes()
    for target, command in (("test", "pytest"), ("test-fast", "pytest"),
                            ("test-real", "pytest"), ("demo", "cortex demo")):
        lines = [line for line in rules[target] if command in line]
        assert lines, f"{target}: no line runs {command}"
        assert all(line.startswith("+") for line in lines), (target, lines)
        if command == "pytest":
            assert all("$(DURATIONS)" in line or "\\" in line for line in lines), lines


def test_each_long_setup_step_says_it_started():
    rules = recipes()
    for target in ("$(STAMP)", "build", "$(ENGINE_STAMP)", "$(MODELS_STAMP)", "dist"):
        assert rules[target][0].startswith("$(SAY)"), (target, rules[target][:1])
