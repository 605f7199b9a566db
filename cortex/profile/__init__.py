"""Model profile and request tokenization: from a request body to the block keys of its prompt.

Pure modules (no I/O beyond reading a profile's files at load time):
``model_profile`` (the versioned unit per model), ``builtin`` (profiles carried by name),
``chat_template`` (Jinja rendering),
``request_text`` (body → text or token ids), ``segments`` + ``segment_cache`` (exact tokenization
cached by piece), ``request_keys`` (token ids → ledger block keys).
"""
