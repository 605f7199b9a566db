"""Serving a request on a model's workers: the layer both ways of serving share.

``model_pool.ModelPool`` is one model's routing state (workers, pending work, scheduler,
profile): it prepares a request (``request.ServeRequest``: prompt, token ids, block keys) and
decides a worker (``route.Route``). ``dispatcher.Dispatcher`` sends one attempt to an engine
and answers the client (legs, exits, blame, admission); ``single.SingleWorker`` is the
one-worker strategy with its retries, beside ``cortex.pd.orchestrate`` for prefill/decode
pairs. ``observer.RouteObserver`` is the hooks this layer reports through (metrics feed it from
above, ``cortex.metrics.route_metrics``).
"""
