"""What the request path reports as it goes: decisions, timings, failures, ledger accuracy.

``RouteObserver`` is the no-op base the gateway calls; the app passes a subclass that feeds
Prometheus (``cortex.metrics.cortex_metrics``) and tests pass one that records. Keeping the hooks here keeps
the gateway free of any metrics library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cortex.dispatch.route import Route


class RouteObserver:
    def template_failed(self, model: str, error: Exception) -> None:
        """The chat template could not render a request: it was routed on load only."""

    def unrenderable(self, model: str, reason: str) -> None:
        """A request Cortex cannot render exactly as the engine will (``reason``: one of
        ``cortex.prompt.unrenderable.REASONS``) was routed on load only."""

    def prompt_too_long(self, model: str, chars: int) -> None:
        """A prompt longer than the model's ``max_prompt_chars`` was routed on load only,
        without tokenizing it."""

    def decided(self, model: str, route: Route, seconds: float) -> None:
        """The first decision of a request, ``seconds`` after its body was in (its
        ``route.timings``: ``tokenize_s`` when the prompt was tokenized, ``hash_s`` when its
        block keys were computed). The single-worker path calls it once the answer is on its
        way."""

    def no_worker(self, model: str) -> None:
        """A request for ``model`` was refused: no worker could take it."""

    def upstream_failed(
        self, worker: str, error: Exception, retried: bool, after_first_byte: bool = False,
        *, blame: bool = True,
    ) -> None:
        """An exchange with ``worker`` failed; ``retried`` if another worker gets the request;
        ``after_first_byte`` if the client had already received part of the response;
        ``blame``: the failure is the worker's (else it may be the request's own and waits for
        a verdict: ``blamed`` or ``poisoned``, ``cortex.dispatch.blame``)."""

    def blamed(self, worker: str, error: Exception) -> None:
        """A failure of ``worker`` reported earlier without blame turned out to be its own:
        another worker served the same request."""

    def poisoned(self, model: str, status: int) -> None:
        """A request of ``model`` failed with ``status`` on two workers: the failure is the
        request's own; the engine's answer was relayed and no worker was blamed."""

    def cached_tokens(self, model: str, route: Route, predicted: int, reported: int) -> None:
        """The engine reported how many prompt tokens it found cached for a routed request."""
