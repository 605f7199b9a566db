"""Cortex's benchmarks, replays and their helpers (figures: ``perf/RESULTS.md``).

A package, so that its scripts import one another (``from perf import benchkit``,
``from perf.replay_cluster import Procs``) and the checkout's ``cortex`` and ``tests`` without
editing ``sys.path``. Run a script as a module from the repository root, which puts the root
first on ``sys.path``::

    .venv/bin/python -m perf.bench_gateway --quick
    .venv/bin/python -m perf.replay --quick --routers cortex,round_robin

A script that starts another one (a mock worker, a replay's gateway) starts it the same way,
``python -m perf.<name>`` with the repository root as its working directory. Two A/B
benchmarks measure another checkout's ``cortex`` by putting that checkout first instead:
``bench_route_turns --repo`` on its own ``sys.path``, and ``peers.start_cortex(repo=...)``,
``bench_http --baseline``, ``bench_upstream --compare`` through the working directory (and
``PYTHONPATH``) of the child they start.

Shared pieces: ``benchkit`` (the machine a result came from, ``percentile``), ``peers``
(starting the systems measured), ``replay_*`` and ``trace_text`` (trace replays).
"""
