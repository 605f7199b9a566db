"""Replicas of one cluster: telling each other the requests they route (``sync``), so that
each counts every replica's requests in flight in its cost (``scheduling.peer_inflight``), and
a new replica's warm start from a peer's ledger snapshot (``warm_start``)."""
