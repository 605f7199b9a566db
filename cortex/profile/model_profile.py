"""``ModelProfile``: the one versioned unit per served model that the request path needs.

A profile holds the tokenizer (``tokenizer.json``), the chat template (Jinja), the block/page
size, BOS handling and the model's key namespace, all loaded from files named in config, plus a
fingerprint. Exact KV routing for a model is on only while its profile loaded and agrees with
what its workers report; otherwise the reason is shown and no hit is ever guessed.

Rules:

* The chat template comes from a ``.jinja`` file or from the ``chat_template`` entry of an HF
  ``tokenizer_config.json``.
* ``load_profile(spec)`` reads every file once and raises ``ProfileError`` listing *every*
  problem found (missing file, unreadable tokenizer, bad template, bad block size, BOS/EOS
  strings that are not single tokens of the vocabulary).
* ``fingerprint`` = XXH3-64 over the tokenizer.json bytes, the template source, the block size
  and the BOS flag (length-prefixed parts), as 16 hex digits: equal profiles have equal
  fingerprints, and any change to the things that decide token ids or keys changes it.
* ``add_bos``: prepend ``bos_id`` to text that is tokenized "with special tokens" (completions
  and ``/generate`` text). A rendered chat is tokenized without it — the template writes BOS
  itself (``bos_token``), as vLLM and SGLang do.
* ``check_worker`` compares a worker's self-report (served model name, page size) with the
  profile; a disagreement is a reason string that turns exact routing off.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import xxhash
from tokenizers import Tokenizer

from cortex.errors import CortexError
from cortex.profile.chat_template import ChatTemplate
from cortex.profile.fast_pieces import FastPieceEncoder
from cortex.profile.segment_cache import SegmentCachedTokenizer
from cortex.profile.segments import Segmenter

MAX_BLOCK_SIZE = 1 << 16


class ProfileError(CortexError):
    """A model profile cannot be loaded; ``problems`` lists every problem at once."""

    def __init__(self, model: str, problems: list[str]) -> None:
        super().__init__(f"model profile {model!r}: " + "; ".join(problems))
        self.model = model
        self.problems = list(problems)


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """What config names for one model (paths are files on disk)."""

    model: str
    tokenizer_path: str
    block_size: int
    chat_template_path: str | None = None
    add_bos: bool = False
    bos_token: str | None = None
    eos_token: str | None = None
    version: str = ""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    model: str
    version: str
    block_size: int
    add_bos: bool
    bos_token: str | None
    eos_token: str | None
    bos_id: int | None
    fingerprint: str
    tokenizer: Tokenizer = field(repr=False, compare=False)
    segmenter: Segmenter = field(repr=False, compare=False)
    chat_template: ChatTemplate | None = field(repr=False, compare=False)
    # exact fast encode of ASCII pieces; ``fast_pieces.why_not_fast`` says when it is off
    fast_pieces: FastPieceEncoder | None = field(default=None, repr=False, compare=False)

    def new_cached_tokenizer(self, capacity_bytes: int = 64 << 20) -> SegmentCachedTokenizer:
        return SegmentCachedTokenizer(
            self.tokenizer,
            self.segmenter,
            capacity_bytes=capacity_bytes,
            bos_id=self.bos_id if self.add_bos else None,
            fast=self.fast_pieces,
        )


def profile_fingerprint(
    tokenizer_json: bytes, template_source: str | None, block_size: int, add_bos: bool
) -> str:
    h = xxhash.xxh3_64(b"cortex-profile-v1")
    for part in (tokenizer_json, (template_source or "").encode()):
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    h.update(struct.pack("<Q?", block_size, template_source is not None))
    h.update(struct.pack("<?", add_bos))
    return h.hexdigest()


def load_profile(spec: ProfileSpec) -> ModelProfile:
    problems: list[str] = []
    if not spec.model:
        problems.append("model name is empty")
    if not isinstance(spec.block_size, int) or not 0 < spec.block_size <= MAX_BLOCK_SIZE:
        problems.append(f"block_size must be an integer in [1, {MAX_BLOCK_SIZE}]")

    tokenizer_bytes = _read(spec.tokenizer_path, "tokenizer", problems)
    tokenizer: Tokenizer | None = None
    segmenter: Segmenter | None = None
    if tokenizer_bytes is not None:
        try:
            tokenizer = Tokenizer.from_str(tokenizer_bytes.decode())
            segmenter = Segmenter.from_tokenizer_json(
                tokenizer_bytes, split=not tokenizer.encode_special_tokens
            )
        except Exception as exc:  # noqa: BLE001 - any parse failure is a profile problem
            problems.append(f"tokenizer {spec.tokenizer_path}: cannot load ({exc})")
            tokenizer = None

    template_source: str | None = None
    template: ChatTemplate | None = None
    if spec.chat_template_path is not None:
        raw = _read(spec.chat_template_path, "chat template", problems)
        if raw is not None:
            try:
                template_source = _template_source(spec.chat_template_path, raw)
                template = ChatTemplate(template_source)
            except Exception as exc:  # noqa: BLE001 - syntax or encoding errors alike
                problems.append(f"chat template {spec.chat_template_path}: {exc}")

    bos_id = _single_token(tokenizer, spec.bos_token, "bos_token", problems)
    _single_token(tokenizer, spec.eos_token, "eos_token", problems)
    if spec.add_bos and spec.bos_token is None:
        problems.append("add_bos is set but bos_token is not")

    if problems:
        raise ProfileError(spec.model, problems)
    assert tokenizer is not None and segmenter is not None and tokenizer_bytes is not None
    return ModelProfile(
        model=spec.model,
        version=spec.version,
        block_size=spec.block_size,
        add_bos=spec.add_bos,
        bos_token=spec.bos_token,
        eos_token=spec.eos_token,
        bos_id=bos_id,
        fingerprint=profile_fingerprint(
            tokenizer_bytes, template_source, spec.block_size, spec.add_bos
        ),
        tokenizer=tokenizer,
        segmenter=segmenter,
        chat_template=template,
        fast_pieces=FastPieceEncoder(tokenizer, segmenter),
    )


def check_worker(
    profile: ModelProfile, reported_model: str | None, reported_block_size: int | None
) -> str | None:
    """Why exact routing must be off for this worker, or ``None`` when it agrees."""
    reasons = []
    if reported_model is None:
        reasons.append("worker did not report its model")
    elif reported_model != profile.model:
        reasons.append(f"worker serves {reported_model!r}, profile is for {profile.model!r}")
    if reported_block_size is None:
        reasons.append("worker did not report its page size")
    elif reported_block_size != profile.block_size:
        reasons.append(
            f"worker page size {reported_block_size} != profile block size {profile.block_size}"
        )
    return "; ".join(reasons) or None


def _template_source(path: str, raw: bytes) -> str:
    """A ``.jinja`` file as is, or the ``chat_template`` of an HF ``tokenizer_config.json``
    (a string, or a list of ``{name, template}`` of which ``default`` is used)."""
    text = raw.decode()
    if not path.endswith(".json"):
        return text
    value = json.loads(text).get("chat_template")
    if isinstance(value, list):
        value = next((t.get("template") for t in value if t.get("name") == "default"), None)
    if not isinstance(value, str):
        raise ValueError("no chat_template (string or 'default' entry) in the file")
    return value


def _read(path: str, what: str, problems: list[str]) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        problems.append(f"{what} {path}: {exc.strerror or exc}")
        return None


def _single_token(
    tokenizer: Tokenizer | None, token: str | None, name: str, problems: list[str]
) -> int | None:
    if token is None or tokenizer is None:
        return None
    tid = tokenizer.token_to_id(token)
    if tid is None or tokenizer.encode(token, add_special_tokens=False).ids != [tid]:
        problems.append(f"{name} {token!r} is not a single token of the vocabulary")
        return None
    return tid
