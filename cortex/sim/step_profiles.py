"""Step-time profiles as data files: ``cortex/sim/profiles/<name>.toml``, loaded and validated.

A profile file holds the seven coefficients of ``cortex.sim.step_time.StepProfile`` (six
price a step, ``request_s`` a request's time outside the steps) with the provenance of each, and optionally the published figures it must reproduce and the data of the
fit that produced it::

    name = "llama-3.1-8b-h100-vllm"
    description = "Llama-3.1-8B, bf16, one H100 SXM, vLLM"   # optional

    [coefficients]                 # seconds; each finite and >= 0; all seven required
    step_s = 6.3e-3
    prefill_token_s = 1.8e-5
    attention_pair_s = 1.0e-9
    decode_seq_s = 6.8e-6
    decode_kv_token_s = 5.1e-8
    prefill_step_s = 0.0           # 0 where nothing was measured: say so in its source
    request_s = 0.0

    [source]                       # where every coefficient comes from: all required
    summary = "..."
    step_s = "..."                 # one per coefficient: the measurement and the arithmetic
    ...
    uncertainty = "..."            # optional

    [[checks]]                     # optional: a figure the profile must reproduce
    what = "decode step, batch 1"
    chunks = [[1024, 0]]           # prefill chunks as [tokens, context]; default none
    decodes = 1                    # default 0
    decode_context = 200           # default 0
    seconds = 6.48e-3              # the published (or measured) figure
    tolerance = 0.10               # relative; the profile's value must be within it
    source = "..."

    [fit]                          # optional, free-form: data, residuals, the command

``read_step_profile(spec)`` names a built-in profile by its name (the file's stem, e.g.
``vllm-cpu-tiny``) or a file by its path (anything with a path separator or ending in
``.toml``), reads it, and reports every problem at once as one ``ConfigError``: unknown keys,
missing or mistyped values, and checks the coefficients do not reproduce.
``load_step_profile(spec)`` is the same, returning just the ``StepProfile``.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex.errors import ConfigError
from cortex.sim.step_time import Chunk, StepProfile, StepWork

PROFILE_DIR = Path(__file__).with_name("profiles")  # package data (pyproject, cortex.spec)
STEP_COEFFICIENTS = ("step_s", "prefill_token_s", "attention_pair_s", "decode_seq_s",
                     "decode_kv_token_s", "prefill_step_s")  # what a step costs
COEFFICIENTS = (*STEP_COEFFICIENTS, "request_s")
TOP_KEYS = frozenset({"name", "description", "coefficients", "source", "checks", "fit"})
SOURCE_KEYS = frozenset({"summary", "uncertainty", *COEFFICIENTS})
CHECK_KEYS = frozenset({"what", "chunks", "decodes", "decode_context", "seconds", "tolerance",
                        "source"})


@dataclass(frozen=True, slots=True)
class ProfileCheck:
    """A figure the profile must reproduce: the step's work, the figure, the tolerance."""

    what: str
    work: StepWork
    seconds: float
    tolerance: float  # relative
    source: str

    def error(self, profile: StepProfile) -> float:
        """The profile's relative error on this figure (signed: + means the profile is slow)."""
        return profile.seconds(self.work) / self.seconds - 1.0


@dataclass(frozen=True, slots=True)
class ProfileFile:
    profile: StepProfile
    checks: tuple[ProfileCheck, ...]
    description: str
    origin: str  # the file it was read from
    fit: dict[str, Any]  # the [fit] table, as written (empty when none)


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with Cortex."""
    return sorted(path.stem for path in PROFILE_DIR.glob("*.toml"))


def profile_path(spec: str | Path) -> Path:
    """The file a profile spec names: a path as given, or a built-in profile by name."""
    if isinstance(spec, Path) or "/" in spec or "\\" in spec or spec.endswith(".toml"):
        return Path(spec)
    if spec not in builtin_profiles():
        known = ", ".join(builtin_profiles())
        message = (f"step profile {spec!r}: no such built-in profile (built-in: {known}; "
                   "or give a path to a .toml file)")
        raise ConfigError([message])
    return PROFILE_DIR / f"{spec}.toml"


def read_step_profile(spec: str | Path) -> ProfileFile:
    """Read and validate a profile file (see the module docstring); every problem at once."""
    path = profile_path(spec)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as error:
        raise ConfigError([f"step profile {path}: {error.strerror or error}"]) from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError([f"step profile {path}: not valid TOML: {error}"]) from None
    return parse_step_profile(data, str(path))


def load_step_profile(spec: str | Path) -> StepProfile:
    return read_step_profile(spec).profile


def parse_step_profile(data: dict[str, Any], origin: str) -> ProfileFile:
    """Validate a profile's parsed TOML; raises one ``ConfigError`` listing every problem."""
    problems: list[str] = []

    def problem(text: str) -> None:
        problems.append(f"step profile {origin}: {text}")

    for key in sorted(data.keys() - TOP_KEYS):
        problem(f"unknown key {key!r}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        problem("name: a non-empty string is required")
    description = data.get("description", "")
    if not isinstance(description, str):
        problem("description: must be a string")
        description = ""

    coefficients: dict[str, float] = {}
    table = _table(data, "coefficients", problem, required=True)
    for key in sorted(table.keys() - set(COEFFICIENTS)):
        problem(f"coefficients: unknown key {key!r}")
    for key in COEFFICIENTS:
        if key not in table:
            if table or "coefficients" in data:
                problem(f"coefficients.{key}: missing")
            continue
        value = _number(table[key])
        if value is None or not math.isfinite(value) or value < 0:
            problem(f"coefficients.{key}: a finite number >= 0 is required, "
                    f"got {table[key]!r}")
        else:
            coefficients[key] = value

    source = _table(data, "source", problem, required=True)
    for key in sorted(source.keys() - SOURCE_KEYS):
        problem(f"source: unknown key {key!r}")
    for key in ("summary", *COEFFICIENTS):
        if not isinstance(source.get(key), str) or not source[key].strip():
            problem(f"source.{key}: the provenance is required (a non-empty string)")
    if "uncertainty" in source and not isinstance(source["uncertainty"], str):
        problem("source.uncertainty: must be a string")

    checks = _checks(data.get("checks", []), problem)
    fit = _table(data, "fit", problem, required=False)

    # the checks are evaluated whenever the coefficients are usable, whatever else is wrong
    timing = StepProfile(name="", **coefficients) if len(coefficients) == len(COEFFICIENTS) else None
    for check in checks if timing is not None else ():
        error = check.error(timing)
        if abs(error) > check.tolerance:
            problem(f"check {check.what!r}: the profile gives {timing.seconds(check.work):.6g} s, "
                    f"{error:+.1%} off the figure {check.seconds:.6g} s "
                    f"(tolerance {check.tolerance:.0%})")
    if problems:
        raise ConfigError(problems)
    text = [source["summary"].strip(), *(f"{key}: {source[key].strip()}" for key in COEFFICIENTS)]
    if "uncertainty" in source:
        text.append(f"uncertainty: {source['uncertainty'].strip()}")
    profile = StepProfile(name=name, source="\n".join(text), **coefficients)
    return ProfileFile(profile, tuple(checks), description, origin, fit)


def _table(data: dict[str, Any], key: str, problem: Callable[[str], None], *,
           required: bool) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        if required:
            problem(f"[{key}]: the table is required")
        return {}
    if not isinstance(value, dict):
        problem(f"{key}: must be a table")
        return {}
    return value


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _checks(raw: object, problem: Callable[[str], None]) -> list[ProfileCheck]:
    if not isinstance(raw, list):
        problem("checks: must be an array of tables ([[checks]])")
        return []
    checks = []
    for index, entry in enumerate(raw):
        where = f"checks[{index}]"
        if not isinstance(entry, dict):
            problem(f"{where}: must be a table")
            continue
        bad = False

        def flag(text: str, where: str = where) -> None:
            nonlocal bad
            bad = True
            problem(f"{where}: {text}")

        for key in sorted(entry.keys() - CHECK_KEYS):
            flag(f"unknown key {key!r}")
        what = entry.get("what")
        if not isinstance(what, str) or not what.strip():
            flag("what: a non-empty string is required")
        if not isinstance(entry.get("source"), str) or not entry["source"].strip():
            flag("source: where the figure comes from is required")
        chunks: list[Chunk] = []
        raw_chunks = entry.get("chunks", [])
        if not isinstance(raw_chunks, list):
            flag("chunks: must be an array of [tokens, context] pairs")
        else:
            for pair in raw_chunks:
                if (isinstance(pair, list) and len(pair) == 2
                        and _count(pair[0]) and _count(pair[1]) is not None):
                    chunks.append(Chunk(pair[0], pair[1]))
                else:
                    flag(f"chunks: {pair!r} is not [tokens >= 1, context >= 0]")
        decodes = _count(entry.get("decodes", 0))
        decode_context = _count(entry.get("decode_context", 0))
        if decodes is None:
            flag("decodes: an integer >= 0 is required")
        if decode_context is None:
            flag("decode_context: an integer >= 0 is required")
        seconds = _number(entry.get("seconds"))
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            flag("seconds: the figure, a finite number > 0, is required")
        tolerance = _number(entry.get("tolerance"))
        if tolerance is None or not 0 < tolerance <= 1:
            flag("tolerance: a relative tolerance in (0, 1] is required")
        work = StepWork(tuple(chunks), decodes or 0, decode_context or 0)
        if not bad and work.empty:
            flag("the step computes nothing: give chunks or decodes")
        if not bad:
            checks.append(ProfileCheck(what, work, seconds, tolerance, entry["source"]))
    return checks
