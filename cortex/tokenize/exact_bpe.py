"""The BPE that encodes a model's text: fastokens where it is proven exact, else ``tokenizers``.

``tokenizers`` (HF's, what vLLM and SGLang tokenize with) is the reference: its BPE costs
~2-3 µs per new token here. ``fastokens`` (PyPI, Apache-2.0, pinned in ``pyproject.toml``: the
linear-time BPE of GitHub's ``rust-gems`` with PCRE2 pre-tokenization; vLLM and Dynamo ship it
as a tokenizer backend) loads the same ``tokenizer.json`` and encodes 10-50x faster
(``perf/RESULTS.md``), releasing the GIL while it works. It is used for a model only after it
gave ``tokenizers``' ids on the model's start check.

Rules:

* ``ExactBpe`` starts on ``tokenizers``; ``upgrade()`` (blocking, ~1-2 s for a 128k-token
  vocabulary: run it in a worker thread or a process of its own) loads fastokens from the same
  bytes and runs ``start_check``: the fixed corpus (``check_corpus``: every script the request
  path sees, control characters, digit and whitespace runs, seeded random mixed-script strings,
  and every added token of the vocabulary in context), each text with and without special
  tokens. Equal on every text: fastokens from then on (one attribute store, atomic for readers
  in other threads); any difference, or fastokens missing or failing to load: ``tokenizers``
  stays, and ``why_not`` says why (the first differing text, shortened). ``upgrade`` runs once;
  ``backend`` names the BPE in use.
* ``ids(text)`` / ``ids_many(texts)``: the ids of ordinary text (``add_special_tokens`` false)
  as ``array('I')``, read from fastokens' flat ``uint32`` buffer without a Python int per
  token. A fastokens error on one input (PCRE2's match limits on a pathological text) encodes
  that call with ``tokenizers`` instead and is counted in ``fallbacks``: never a wrong id.
* Thread-safe: both libraries' encoders take ``&self``; nothing here is mutated after
  ``upgrade`` but counters. fastokens' first encode in each thread costs ~15 ms (its per-thread
  matcher state, measured): ``upgrade(activate=False)`` in a worker thread, then ``activate``
  in the event loop's thread pays it there once, before any request can.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from array import array
from collections.abc import Iterator, Sequence
from importlib import metadata

from tokenizers import Tokenizer

__all__ = ["FASTOKENS", "TOKENIZERS", "ExactBpe", "check_corpus", "start_check"]

log = logging.getLogger("cortex.tokenize")

FASTOKENS = "fastokens"
TOKENIZERS = "tokenizers"
NOT_CHECKED = "not checked yet"  # ``why_not`` until the start check has run
_LITTLE = sys.byteorder == "little"  # fastokens' flat buffers are little-endian
_SHOWN_CHARS = 48  # of a differing text, in ``why_not``

# One sample of each script and shape the request path sees (not exhaustive: the random strings
# below mix them; the property tests go further).
_SAMPLES = (
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; you'll see we're DONE.",
    "def handle(request: dict) -> int:\n    if not request:\n        return -1\n\treturn 0\n",
    '{"name": "read_file", "arguments": {"path": "src/a.py", "limit": 40, "ok": true}}',
    "上下文缓存感知的推理网关，把每个请求送到其前缀已在显存中的工作节点。（第３版）",
    "キャッシュを意識したゲートウェイです。カタカナとひらがな、漢字。",
    "한국어 문장도 정확히 토큰화되어야 합니다. 숫자 12345와 함께.",
    "Привет, мир! Ελληνικά γράμματα. مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก",
    "emoji 👩‍💻🏳️‍🌈👍🏽 flags 🇫🇷🇯🇵 symbols ∑∫√≈≠ ← → ™ © ½ ①②③ ｆｕｌｌｗｉｄｔｈ",
    "combining: e\u0301 a\u0308 n\u0303 \u1e9b\u0323 Å A\u030a ﬁ ﬀ \u212b \u2126 ｶﾞ",
    "controls:\x00\x01\x07\x08\x0b\x0c\x1b\x1f\x7f \x85 \u2028\u2029 \u200b\u200d\ufeff end",
    "digits 1 12 123 1234 12345 1234567890123 3.14159 -42 1e-9 0x1F ٣٤٥ १२३",
    "spaces  two   three    \t\ttabs\r\ncrlf\n\n\nthree newlines   \n trailing   ",
    "punct!!! ??? ... --- ___ *** ### ``` ''' \"\"\" <<< >>> ((( ))) [[ ]] {{ }} ;; ::",
    "'s 'S 't 're 've 'm 'll 'd 'LL don't I'M they'RE",
    "\ue000\uf8ff private use, \U0001f9ff\U000e0001 tags, unassigned \u0378\u0379",
)
# Code points the random strings draw from (weighted by how many ranges name a script).
_RANGES = (
    (0x20, 0x7E), (0x20, 0x7E), (0x0A, 0x0A), (0x09, 0x0D), (0x00, 0x1F), (0x80, 0xFF),
    (0x0300, 0x036F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0590, 0x05FF), (0x0600, 0x06FF),
    (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x3000, 0x303F),
    (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
    (0x1F300, 0x1FAFF), (0x30, 0x39), (0x30, 0x39),
)
RANDOM_TEXTS = 400
_SEED = 0x5EED_B9E


def check_corpus(added_tokens: Sequence[str]) -> Iterator[str]:
    """The start check's texts: the samples, ``RANDOM_TEXTS`` seeded random mixed-script
    strings (1-96 characters) and every added token between ordinary text, in groups."""
    yield from _SAMPLES
    rng = random.Random(_SEED)
    for _ in range(RANDOM_TEXTS):
        yield "".join(chr(rng.randint(*rng.choice(_RANGES)))
                      for _ in range(rng.randint(1, 96)))
    joints = (" ", "", "\n", "x", "中", " 12", "\t")
    group: list[str] = []
    for at, token in enumerate(added_tokens):
        group.append(f"{joints[at % len(joints)]}{token}")
        if len(group) == 32:
            yield "a" + "".join(group) + " z"
            group = []
    if group:
        yield "a" + "".join(group) + " z"


def start_check(fast: object, reference: Tokenizer, texts: Sequence[str]) -> str | None:
    """The first text on which ``fast`` (a fastokens ``Tokenizer``) and ``reference`` give
    different ids, with or without special tokens, as a reason; ``None`` when they agree."""
    for text in texts:
        for special in (False, True):
            want = reference.encode(text, add_special_tokens=special).ids
            got = fast.encode(text, add_special_tokens=special).ids  # type: ignore[attr-defined]
            if got != want:
                return (f"fastokens differs from tokenizers on {text[:_SHOWN_CHARS]!r}"
                        f"{'...' if len(text) > _SHOWN_CHARS else ''} (add_special_tokens="
                        f"{special}): {got[:8]}... != {want[:8]}...")
    return None


class ExactBpe:
    __slots__ = ("_checked", "_fast", "_lock", "_reference", "_tokenizer_json", "backend",
                 "checked_texts", "fallbacks", "why_not")

    def __init__(self, reference: Tokenizer, tokenizer_json: str | None) -> None:
        """``tokenizer_json`` ``None``: the reference only (``upgrade`` keeps it)."""
        self._reference = reference
        self._tokenizer_json = tokenizer_json
        self._fast: object | None = None
        self._checked: object | None = None  # passed the start check
        self._lock = threading.Lock()
        self.backend = TOKENIZERS
        # why fastokens is not used
        self.why_not: str | None = (NOT_CHECKED if tokenizer_json is not None
                                    else "no tokenizer.json to load it from")
        self.checked_texts = 0
        self.fallbacks = 0

    @property
    def settled(self) -> bool:
        """Whether the start check has given its verdict and the backend it chose encodes:
        nothing about this BPE changes any more."""
        return self.why_not != NOT_CHECKED and (self._checked is None or self._fast is not None)

    @property
    def version(self) -> str:
        """The backend's library version."""
        try:
            return metadata.version(self.backend)
        except metadata.PackageNotFoundError:
            return "?"

    def upgrade(self, activate: bool = True) -> str | None:
        """Load fastokens and use it if the start check holds; ``why_not`` (``None``: in use).
        Blocking; a second call returns the first one's verdict. ``activate`` false: checked
        but not used until ``activate()`` (called in the thread that will encode most)."""
        with self._lock:
            if self._tokenizer_json is None:
                return self.why_not
            source, self._tokenizer_json = self._tokenizer_json, None
            try:
                import fastokens  # optional at run time: tokenizers stays

                fast = fastokens.Tokenizer.from_json_str(source)
            except Exception as exc:  # noqa: BLE001 - missing or unable: the reference stays
                self.why_not = f"fastokens cannot load this tokenizer ({exc})"
                return self.why_not
            added = sorted(self._reference.get_added_tokens_decoder().values(),
                           key=lambda token: token.content)
            texts = list(check_corpus([token.content for token in added]))
            try:
                why_not = start_check(fast, self._reference, texts)
            except Exception as exc:  # noqa: BLE001 - an encode that fails is a difference
                why_not = f"fastokens failed on the start check ({exc})"
            self.checked_texts = len(texts)
            self.why_not = why_not
            if why_not is None:
                self._checked = fast
                if activate:
                    self.activate()
            return why_not

    def activate(self) -> float:
        """Use the checked fastokens from now on, after one encode in the calling thread
        (its ~15 ms of per-thread set-up, paid here rather than by a request); the seconds
        that encode took (0 when there is nothing to activate)."""
        fast = self._checked
        if fast is None or self._fast is not None:
            return 0.0
        started = time.perf_counter()
        fast.encode_batch_flat([_SAMPLES[0] + _SAMPLES[3]])
        took = time.perf_counter() - started
        self._fast = fast
        self.backend = FASTOKENS
        return took

    def ids(self, text: str) -> array[int]:
        """The ids of ``text`` without special tokens."""
        fast = self._fast
        if fast is not None:
            try:
                flat, _ = fast.encode_batch_flat([text])  # type: ignore[attr-defined]
                return _uint32s(flat)
            except Exception as exc:  # noqa: BLE001 - counted; the reference answers
                self._fell_back(exc)
        return array("I", self._reference.encode(text, add_special_tokens=False).ids)

    def ids_many(self, texts: list[str]) -> list[array[int]]:
        """The ids of each text without special tokens, in one call."""
        fast = self._fast
        if fast is not None:
            try:
                flat, offsets = fast.encode_batch_flat(texts)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - counted; the reference answers
                self._fell_back(exc)
            else:
                ids, bounds = _uint32s(flat), array("Q", offsets)
                if not _LITTLE:
                    bounds.byteswap()
                return [ids[bounds[i]:bounds[i + 1]] for i in range(len(texts))]
        encodings = self._reference.encode_batch_fast(texts, add_special_tokens=False)  # no offsets
        return [array("I", encoding.ids) for encoding in encodings]

    def _fell_back(self, error: Exception) -> None:
        if not self.fallbacks:
            log.warning("fastokens failed to encode a text (%s); tokenizers encodes it "
                        "(counted in cortex_tokenizer_fallbacks_total, said once)", error)
        self.fallbacks += 1


def _uint32s(flat: bytes) -> array[int]:
    ids = array("I", flat)
    if not _LITTLE:
        ids.byteswap()
    return ids
