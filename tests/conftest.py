"""Test-wide fixtures: where the shared protocol fixtures live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    """``shared/`` sits beside the checkout (developer machines and CI alike)."""
    override = os.environ.get("CORTEX_SHARED_DIR")
    path = Path(override) if override else REPO.parent / "shared"
    if not (path / "fixtures" / "kv-events").is_dir():
        raise RuntimeError(f"shared fixtures not found at {path} (set CORTEX_SHARED_DIR)")
    return path


@pytest.fixture(scope="session")
def kv_fixtures_dir() -> Path:
    return shared_dir() / "fixtures" / "kv-events"


@pytest.fixture(scope="session")
def hash_examples_path() -> Path:
    return shared_dir() / "fixtures" / "block-hashing" / "hash-examples.json"
