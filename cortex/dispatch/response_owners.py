"""Which worker holds a stored OpenAI Responses answer, for requests that continue it. Pure.

An engine that stores responses (vLLM with ``VLLM_ENABLE_RESPONSES_API_STORE=1``) keeps them
in its own memory: a request naming ``previous_response_id`` can be served only by the worker
that produced that response — any other answers 404. Cortex remembers, per replica, the id of
every successful ``/v1/responses`` answer and the worker that gave it, and sends a continuation
to that worker (load-aware otherwise: an id it never saw, or whose worker left the pool).

Rules:

* The id is the first ``"id": "<value>"`` in the answer's first bytes: the top-level ``id`` of
  a JSON response, the ``response.id`` of a stream's ``response.created`` event (both the
  first ``id`` key vLLM writes). Not found there (a first chunk cut inside it): not learned.
* At most ``capacity`` ids are kept, least recently used dropped first; a learned id moves to
  the back, and so does one that is looked up.
* Several Cortex replicas each know only the answers they relayed.
"""

from __future__ import annotations

import re
from collections import OrderedDict

CAPACITY = 65536  # ~100 bytes each: a few MiB
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')


class ResponseOwners:
    __slots__ = ("_owners", "capacity")

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def learn(self, first_bytes: bytes, worker: str) -> str | None:
        """Remember the worker of the answer starting with ``first_bytes``; its id, if found."""
        found = _ID.search(first_bytes, 0, 4096)
        if found is None:
            return None
        response_id = found.group(1).decode("utf-8", "replace")
        owners = self._owners
        owners[response_id] = worker
        owners.move_to_end(response_id)
        if len(owners) > self.capacity:
            owners.popitem(last=False)
        return response_id

    def owner(self, response_id: object) -> str | None:
        """The worker that answered ``response_id``, if remembered."""
        if not isinstance(response_id, str):
            return None
        worker = self._owners.get(response_id)
        if worker is not None:
            self._owners.move_to_end(response_id)
        return worker
