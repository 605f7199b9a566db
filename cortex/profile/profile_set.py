"""``ProfileSet``: the profiles of every configured model, and why exact routing is off where
it is off.

Rules:

* ``load_profiles(specs)`` never raises for one bad profile: a model whose profile cannot be
  loaded is listed with the ``ProfileError`` problems as its reason (config validation may
  still choose to refuse to start). Two specs for one model are a problem of that model.
* Exact routing for a model is on only when its profile loaded and every worker check so far
  agreed; ``note_worker`` records a disagreement (``check_worker``) per worker, and a later
  agreeing report from the same worker clears it.
* ``exact_routing_off(model)`` is the visible reason (``None`` = on): unknown model, profile not
  loaded, or the first disagreeing worker's reason. Never a guessed hit.

Pure and single-owner.
"""

from __future__ import annotations

from collections.abc import Iterable

from cortex.profile.model_profile import (
    ModelProfile,
    ProfileError,
    ProfileSpec,
    check_worker,
    load_profile,
)


class ProfileSet:
    __slots__ = ("_load_errors", "_profiles", "_worker_reasons")

    def __init__(
        self, profiles: dict[str, ModelProfile], load_errors: dict[str, str]
    ) -> None:
        self._profiles = profiles
        self._load_errors = load_errors
        self._worker_reasons: dict[str, dict[str, str]] = {}

    def profile(self, model: str) -> ModelProfile | None:
        return self._profiles.get(model)

    def loaded(self) -> dict[str, ModelProfile]:
        """Model -> its profile, for every profile that loaded."""
        return dict(self._profiles)

    def load_errors(self) -> dict[str, str]:
        """Model -> why its profile could not be loaded."""
        return dict(self._load_errors)

    @property
    def models(self) -> list[str]:
        return sorted({*self._profiles, *self._load_errors})

    def note_worker(
        self, model: str, worker: str, reported_model: str | None,
        reported_block_size: int | None, prefix_caching: bool | None = None,
        folds_pages: bool = False,
    ) -> str | None:
        """Record what ``worker`` says about itself; returns the disagreement, if any."""
        profile = self._profiles.get(model)
        if profile is None:
            return self.exact_routing_off(model)
        reason = check_worker(profile, reported_model, reported_block_size, prefix_caching,
                              folds_pages)
        reasons = self._worker_reasons.setdefault(model, {})
        if reason is None:
            reasons.pop(worker, None)
        else:
            reasons[worker] = reason
        return reason

    def forget_worker(self, model: str, worker: str) -> None:
        self._worker_reasons.get(model, {}).pop(worker, None)

    def exact_routing_off(self, model: str) -> str | None:
        if model in self._load_errors:
            return f"profile not loaded: {self._load_errors[model]}"
        if model not in self._profiles:
            return f"no profile configured for model {model!r}"
        reasons = self._worker_reasons.get(model)
        if reasons:
            worker = min(reasons)
            return f"worker {worker} disagrees with the profile: {reasons[worker]}"
        return None


def load_profiles(specs: Iterable[ProfileSpec]) -> ProfileSet:
    profiles: dict[str, ModelProfile] = {}
    errors: dict[str, str] = {}
    seen: set[str] = set()
    for spec in specs:
        if spec.model in seen:
            profiles.pop(spec.model, None)
            errors[spec.model] = "more than one profile configured"
            continue
        seen.add(spec.model)
        try:
            profiles[spec.model] = load_profile(spec)
        except ProfileError as exc:
            errors[spec.model] = "; ".join(exc.problems)
    return ProfileSet(profiles, errors)
