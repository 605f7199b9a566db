"""Exits: entered managers are left last first, each once, all of them even when one raises
(the first error is raised after), and a second aclose does nothing."""

from __future__ import annotations

import pytest

from cortex.dispatch.exits import Exits


class Sync:
    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    def __enter__(self) -> str:
        self.log.append(f"enter {self.name}")
        return self.name

    def __exit__(self, *exc: object) -> None:
        assert exc == (None, None, None)
        self.log.append(f"exit {self.name}")
        if self.fail:
            raise ValueError(self.name)


class Async(Sync):
    async def __aenter__(self) -> str:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)


async def test_exits_run_last_entered_first_and_once():
    log: list[str] = []
    exits = Exits()
    assert exits.enter_context(Sync("hold", log)) == "hold"
    assert await exits.enter_async_context(Async("exchange", log)) == "exchange"
    await exits.aclose()
    await exits.aclose()
    assert log == ["enter hold", "enter exchange", "exit exchange", "exit hold"]


async def test_every_exit_runs_and_the_first_error_is_raised():
    log: list[str] = []
    exits = Exits()
    exits.enter_context(Sync("a", log, fail=True))
    exits.enter_context(Sync("b", log))
    await exits.enter_async_context(Async("c", log, fail=True))
    with pytest.raises(ValueError, match="c"):
        await exits.aclose()
    assert log[3:] == ["exit c", "exit b", "exit a"]
