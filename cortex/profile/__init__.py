"""A served model's profile: its settings, tokenizer and chat template assembled and checked
(``model_profile``, ``hf_settings``, ``builtin``, ``profile_set``), tokenization off the trio
thread (``trio_tokenize``), and a request's ledger block keys under it (``request_keys``)."""
