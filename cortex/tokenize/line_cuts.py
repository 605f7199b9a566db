"""``LineCutter``: exact cuts inside one ordinary piece, at line starts.

The segmenter cuts only at added tokens, so one long message (a tool output appended to, a
streamed answer continued, a big file pasted into a completion prompt) is one piece, and a
piece that grew is new text as a whole: re-encoding a 30k-token message to pay for its 2k new
tokens is the cliff this removes. A long piece is cut into chunks here, each cached on its own;
a grown piece then pays for its new text and at most one chunk before it.

The cut (``CUT``): just after a ``\\n``, where the next line starts with a *solid* character —
ASCII ``!``..``~`` or a CJK ideograph U+4E00..U+9FA5 — possibly after spaces and tabs. For the
pre-tokenizers this module knows (``KNOWN_SPLITS``: DeepSeek-V3's three ``Split`` regexes,
Qwen2's and Llama-3's one, each followed by ``ByteLevel(use_regex=false)``), encoding the two
sides apart equals encoding the whole, because:

* no alternative of those regexes continues from a ``\\n`` into a non-whitespace character
  (the letter runs exclude ``\\r\\n`` from their optional first character, DeepSeek's lead class
  is ASCII punctuation, the punctuation runs end in ``[\\r\\n]*``), and the whitespace run
  after the cut holds no ``\\r``/``\\n``, so the match holding that ``\\n`` ends at the cut both
  in the whole text and in the left side alone (``\\s*[\\r\\n]+`` backtracks to the run's last
  newline: the cut); matching on the right starts afresh there (no lookbehind), and the
  lookahead ``(?!\\S)`` sees only characters of its own side;
* DeepSeek's earlier splits (digit runs, CJK runs) never span a ``\\n``;
* BPE merges never cross a pre-token, and ``ByteLevel`` maps bytes one by one;
* an NFC or NFKC normalizer (Qwen's) normalizes the sides alike: the ``\\n`` before the cut and
  the solid or blank character after it are starters that compose with nothing, and are their
  own normal forms;
* every added token of the tokenizer is cut out by the segmenter (so none spans a cut).

No Unicode table is consulted (the solid characters are explicit code points: ASCII, and CJK
Unified Ideographs that are letters in every Unicode version since 1.1), so onig's and Python's
Unicode versions cannot disagree about a cut. A cut stays a cut in any sub-text holding it (the rule reads one line ahead, never past the next
``\\n``), so cutting at several is exact too. Anything else (other normalizers or pre-tokenizers,
a model other than BPE without dropout, truncation or padding, added tokens the segmenter does
not cut at) turns cutting off; ``why_not_cutting`` says why. Proven by
``tests/property/test_line_cuts_exact.py`` against one ``Tokenizer.encode`` with both families.

Rules: ``chunks`` cuts at the first cut at least ``min_chars`` after the chunk's start, so a
piece's chunks depend only on the text up to one line after them (a grown piece keeps its
earlier chunks); pieces shorter than that are never looked at. The request path cuts with the
compiled twin of ``chunks`` (``cortex._fast.piece_cache.line_chunks``, property-tested equal:
the ``re`` version cost ~100 µs per 32k-token prompt, every piece of it seen before).
"""

from __future__ import annotations

import json
import re
from typing import Any

from cortex.tokenize.segments import Segmenter

CHUNK_CHARS = 1024  # ~250 English / ~700 Chinese tokens: what a grown piece re-pays at most
CUT = re.compile("\n(?=[ \t]*[!-~\u4e00-\u9fa5])")

# The pre-tokenizer regexes (as tokenizer.json holds them) the argument above was checked for.
KNOWN_SPLITS: dict[str, tuple[str, ...]] = {
    "deepseek-v3": (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
         "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
    ),
    "qwen2": (
        ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
         "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    ),
    "llama3": (
        ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
         "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    ),
}
_NORMALIZERS = (None, "NFC", "NFKC")


def _state(component: Any) -> Any:
    return None if component is None else json.loads(component.__getstate__())


def why_not_cutting(tokenizer: Any, segmenter: Segmenter) -> str | None:
    """Why cutting at line starts is not known to be exact for ``tokenizer`` (``None``: it is)."""
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return "truncation or padding is set"
    norm = _state(tokenizer.normalizer)
    kind = None if norm is None or (norm.get("type") == "Sequence"
                                    and not norm.get("normalizers")) else norm.get("type")
    if kind not in _NORMALIZERS:
        return f"normalizer {kind} is not modelled"
    model_type = type(tokenizer.model).__name__
    if model_type != "BPE" or tokenizer.model.dropout not in (None, 0.0):
        return f"model {model_type} with dropout {getattr(tokenizer.model, 'dropout', None)}"
    pre = _state(tokenizer.pre_tokenizer)
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    last = steps[-1] if steps else None
    if not (isinstance(last, dict) and last.get("type") == "ByteLevel"
            and last.get("use_regex") is False and last.get("add_prefix_space") is False):
        return "pre-tokenizer does not end in ByteLevel(add_prefix_space=false, use_regex=false)"
    regexes = []
    for step in steps[:-1]:
        if not (isinstance(step, dict) and step.get("type") == "Split"
                and step.get("behavior") == "Isolated" and not step.get("invert")):
            return "a pre-tokenizer step is not Split(Regex, Isolated)"
        regexes.append((step.get("pattern") or {}).get("Regex"))
    if tuple(regexes) not in KNOWN_SPLITS.values():
        return "the pre-tokenizer's split regexes are not ones line cuts were checked for"
    if segmenter.why_not_splitting is not None:
        return f"the segmenter does not split ({segmenter.why_not_splitting})"
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content}
    if added - segmenter.tokens:
        return f"the segmenter does not split at {len(added - segmenter.tokens)} added tokens"
    return None


class LineCutter:
    """Cuts of one tokenizer's pieces (see the module docstring); ``enabled`` only when
    ``why_not_cutting`` is ``None``."""

    __slots__ = ("min_chars", "why_not_cutting")

    def __init__(self, tokenizer: Any, segmenter: Segmenter, *,
                 min_chars: int = CHUNK_CHARS) -> None:
        if min_chars < 1:
            raise ValueError("min_chars must be >= 1")
        self.why_not_cutting = why_not_cutting(tokenizer, segmenter)
        self.min_chars = min_chars

    @property
    def enabled(self) -> bool:
        return self.why_not_cutting is None

    def chunks(self, text: str) -> list[str]:
        """``text`` cut at the first cut at least ``min_chars`` after each chunk's start (the
        whole ``text`` when cutting is off); the chunks concatenate back to ``text``."""
        size = self.min_chars
        if self.why_not_cutting is not None or len(text) <= size:
            return [text]
        out = []
        start = 0
        search = CUT.search
        while True:
            found = search(text, start + size - 1)
            if found is None:
                break
            cut = found.end()
            out.append(text[start:cut])
            start = cut
        out.append(text[start:])
        return out
