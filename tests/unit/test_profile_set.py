"""ProfileSet: exact routing per model is on only with a loaded, agreeing profile."""

from __future__ import annotations

from cortex.profile.model_profile import ProfileSpec
from cortex.profile.profile_set import load_profiles
from tests import deepseek_profile as ds

GOOD = ProfileSpec(model="ds", tokenizer_path=ds.TOKENIZER_JSON, block_size=16)
BAD = ProfileSpec(model="broken", tokenizer_path="/nonexistent/tokenizer.json", block_size=16)


def test_reasons_for_missing_broken_and_disagreeing_profiles():
    profiles = load_profiles([GOOD, BAD])
    assert profiles.models == ["broken", "ds"]
    assert profiles.exact_routing_off("ds") is None
    assert profiles.profile("ds") is not None and profiles.profile("broken") is None
    assert "profile not loaded" in profiles.exact_routing_off("broken")
    assert "/nonexistent/tokenizer.json" in profiles.exact_routing_off("broken")
    assert "no profile configured" in profiles.exact_routing_off("other")

    assert profiles.note_worker("ds", "w1", "ds", 16) is None
    assert "page size 32" in profiles.note_worker("ds", "w2", "ds", 32)
    assert "worker w2 disagrees" in profiles.exact_routing_off("ds")
    profiles.note_worker("ds", "w2", "ds", 16)  # fixed its page size
    assert profiles.exact_routing_off("ds") is None
    profiles.note_worker("ds", "w3", "llama", 16)
    profiles.forget_worker("ds", "w3")
    assert profiles.exact_routing_off("ds") is None
    assert "profile not loaded" in profiles.note_worker("broken", "w1", "broken", 16)


def test_two_profiles_for_one_model_turn_it_off():
    profiles = load_profiles([GOOD, GOOD])
    assert profiles.profile("ds") is None
    assert "more than one profile" in profiles.exact_routing_off("ds")
