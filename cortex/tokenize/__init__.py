"""From a prompt's text to the engine's token ids, exactly: the pre-tokenizer's pieces
(``segments``, ``line_cuts``), the BPE proven equal to the engine's (``exact_bpe``), and the
caches of pieces and remembered prompts (``segment_cache``). Pure."""
