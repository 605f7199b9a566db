"""``ModelProfile``: the one versioned unit per served model that the request path needs.

A profile holds the tokenizer (``tokenizer.json``), the chat templates (Jinja), the block/page
size, BOS handling and the model's key namespace, all loaded from files named in config, plus a
fingerprint. Exact KV routing for a model is on only while its profile loaded and agrees with
what its workers report; otherwise the reason is shown and no hit is ever guessed.

Rules:

* ``tokenizer_path`` is the model's ``tokenizer.json`` or the model directory holding it. The
  directory is read the way the engines' ``transformers`` reads it (``hf_settings``): the named
  special tokens of ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ``pad_token``, ...
  in any of their written forms) become template variables, and its chat template(s) are used
  when no ``chat_template_path`` is given. What config states explicitly (``bos_token``,
  ``eos_token``, ``add_bos``, ``chat_template_path``) wins over the directory.
* ``builtin`` names a profile Cortex carries (``cortex.profile.builtin``) instead of
  ``tokenizer_path`` (one of the two, never both): its ``tokenizer.json`` is read as any other
  (with its directory's settings) and its chat template is used unless ``chat_template_path``
  is given.
* The chat template comes from ``chat_template_path`` (a ``.jinja`` file, an HF
  ``tokenizer_config.json`` or a model directory), else the builtin's, else the tokenizer's
  directory's; named templates are picked per request (``ChatTemplates``).
* ``add_bos`` (text tokenized "with special tokens": completions and ``/generate`` text): when
  not stated, what the tokenizer itself does — the ids ``tokenizer.json``'s post-processor puts
  around a text, or, for a ``tokenizer.json`` without one, BOS/EOS per ``add_bos_token`` /
  ``add_eos_token`` (transformers builds its post-processor from them only then). A single
  leading id is ``bos_id``; anything else around the text is a problem (not predictable).
  A rendered chat is tokenized without special tokens — the template writes BOS itself.
* ``load_profile(spec)`` reads every file once and raises ``ProfileError`` listing *every*
  problem found (missing file, unreadable tokenizer, bad template, bad block size, BOS/EOS
  strings that are not single tokens of the vocabulary).
* ``fingerprint`` = XXH3-64 over the tokenizer.json bytes, the templates with the variables
  they get, the block size and the BOS flag (length-prefixed parts), as 16 hex digits: equal
  profiles have equal fingerprints, and any change to the things that decide token ids or keys
  changes it.
* ``bpe`` (``exact_bpe.ExactBpe``) encodes the text between added tokens: ``tokenizers`` from
  the load on, fastokens once ``bpe.upgrade()`` has shown it gives the same ids (the gateway
  runs it in the background after its start; the fingerprint does not change: the ids do not).
* ``check_worker`` compares a worker's self-report (served model name, page size, prefix
  caching) with the profile; a disagreement is a reason string that turns exact routing off.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import xxhash
from tokenizers import Tokenizer

from cortex.errors import CortexError
from cortex.profile.builtin import builtin_files
from cortex.profile.hf_settings import (
    HfSettings,
    named_templates,
    pick_template,
    read_hf_settings,
)
from cortex.prompt.chat_template import ChatTemplate, ChatTemplates
from cortex.tokenize.exact_bpe import ExactBpe
from cortex.tokenize.line_cuts import LineCutter
from cortex.tokenize.segment_cache import RECENT_BYTES, SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter

MAX_BLOCK_SIZE = 1 << 16
TOKENIZER_FILE = "tokenizer.json"


class ProfileError(CortexError):
    """A model profile cannot be loaded; ``problems`` lists every problem at once."""

    def __init__(self, model: str, problems: list[str]) -> None:
        super().__init__(f"model profile {model!r}: " + "; ".join(problems))
        self.model = model
        self.problems = list(problems)


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """What config names for one model (paths are files or directories on disk); ``None``
    for ``add_bos`` / ``bos_token`` / ``eos_token``: as the model's files say. ``builtin``
    (a ``cortex.profile.builtin`` name) stands in for ``tokenizer_path`` (then ``None``)."""

    model: str
    tokenizer_path: str | None
    block_size: int
    chat_template_path: str | None = None
    add_bos: bool | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    version: str = ""
    builtin: str | None = None


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
    # what encodes ordinary text: ``tokenizer`` until ``bpe.upgrade()`` proves fastokens exact
    bpe: ExactBpe = field(repr=False, compare=False)
    segmenter: Segmenter = field(repr=False, compare=False)
    chat_templates: ChatTemplates | None = field(repr=False, compare=False)
    # exact cuts of long pieces at line starts; ``line_cuts.why_not_cutting`` says when off
    line_cuts: LineCutter | None = field(default=None, repr=False, compare=False)
    # the named special tokens every chat template gets (HF's ``special_tokens_map``)
    template_tokens: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The template of a request without tools."""
        return None if self.chat_templates is None else self.chat_templates.default

    def tokenization_notes(self) -> list[str]:
        """What an operator should know once about this profile's tokenization: each exact
        shortcut that is off, and why (a slower path, never a wrong id). (The BPE's own verdict
        comes later, from ``bpe.upgrade``.)"""
        reason = None if self.line_cuts is None else self.line_cuts.why_not_cutting
        return [] if reason is None else [f"line cuts of long pieces off: {reason}"]

    def new_cached_tokenizer(self, capacity_bytes: int = 64 << 20,
                             recent_bytes: int = RECENT_BYTES) -> SegmentCachedTokenizer:
        return SegmentCachedTokenizer(
            self.bpe,
            self.segmenter,
            capacity_bytes=capacity_bytes,
            recent_bytes=recent_bytes,
            bos_id=self.bos_id if self.add_bos else None,
            cutter=self.line_cuts,
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

    tokenizer_path, builtin_template = _tokenizer_source(spec, problems)
    tokenizer_file, settings = _model_files(tokenizer_path, problems)
    tokenizer_bytes = None if tokenizer_file is None else _read(tokenizer_file, "tokenizer",
                                                                problems)
    tokenizer: Tokenizer | None = None
    segmenter: Segmenter | None = None
    if tokenizer_bytes is not None:
        try:
            tokenizer = Tokenizer.from_str(tokenizer_bytes.decode())
            segmenter = Segmenter.from_tokenizer_json(
                tokenizer_bytes, split=not tokenizer.encode_special_tokens
            )
        except Exception as exc:  # noqa: BLE001 - any parse failure is a profile problem
            problems.append(f"tokenizer {tokenizer_file}: cannot load ({exc})")
            tokenizer = None

    # Stated tokens must be single tokens; the directory's are template text as they are
    # (a BOS that is not one token is then simply not prepended).
    tokens = dict(settings.special_tokens)
    for name, value in (("bos_token", spec.bos_token), ("eos_token", spec.eos_token)):
        if value is not None:
            tokens[name] = value
            _single_token(tokenizer, value, name, problems)
    bos_token, eos_token = tokens.get("bos_token"), tokens.get("eos_token")
    bos_id = _single_token(tokenizer, bos_token, "bos_token", [])

    sources = _template_sources(spec, settings, builtin_template, problems)
    origin = spec.chat_template_path or (
        f"builtin {spec.builtin}" if builtin_template is not None else settings.templates_from)
    templates = _compile(sources, tokens, origin, problems)

    add_bos = spec.add_bos
    if add_bos is None and tokenizer is not None:
        add_bos, derived_bos = _adds_bos(tokenizer, settings, bos_id, problems)
        bos_id = derived_bos if derived_bos is not None else bos_id
    if add_bos and bos_id is None and not any(p.startswith("bos_token") for p in problems):
        problems.append("add_bos is set but bos_token is not" if bos_token is None else
                        f"add_bos is set but bos_token {bos_token!r} is not a single token")

    if problems:
        raise ProfileError(spec.model, problems)
    assert tokenizer is not None and segmenter is not None and tokenizer_bytes is not None
    return ModelProfile(
        model=spec.model,
        version=spec.version,
        block_size=spec.block_size,
        add_bos=bool(add_bos),
        bos_token=bos_token,
        eos_token=eos_token,
        bos_id=bos_id,
        fingerprint=profile_fingerprint(
            tokenizer_bytes, template_identity(sources, tokens), spec.block_size,
            bool(add_bos)),
        tokenizer=tokenizer,
        bpe=ExactBpe(tokenizer, tokenizer_bytes.decode()),
        segmenter=segmenter,
        chat_templates=templates,
        line_cuts=LineCutter(tokenizer, segmenter),
        template_tokens=tokens,
    )


def check_worker(
    profile: ModelProfile,
    reported_model: str | None,
    reported_block_size: int | None,
    prefix_caching: bool | None = None,
    folds_pages: bool = False,
) -> str | None:
    """Why exact routing must be off for this worker, or ``None`` when it agrees.
    ``prefix_caching`` ``None``: the worker does not say (it is then not held against it).
    ``folds_pages``: the ledger folds this worker's one-token pages into the profile's blocks
    (an SGLang worker, ``LedgerBook.fold_pages``), so a page size of 1 agrees too."""
    reasons = []
    if reported_model is None:
        reasons.append("worker did not report its model")
    elif reported_model != profile.model:
        reasons.append(f"worker serves {reported_model!r}, profile is for {profile.model!r}")
    if reported_block_size is None:
        reasons.append("worker did not report its page size")
    elif reported_block_size != profile.block_size and not (
            folds_pages and reported_block_size == 1):
        reasons.append(
            f"worker page size {reported_block_size} != profile block size {profile.block_size}"
        )
    if prefix_caching is False:
        reasons.append("worker has prefix caching off (it would never serve a cached token)")
    return "; ".join(reasons) or None


def _tokenizer_source(spec: ProfileSpec, problems: list[str]) -> tuple[str | None, str | None]:
    """The tokenizer path to read and the builtin's chat template (``None``: no builtin)."""
    if spec.builtin is None:
        if not spec.tokenizer_path:
            problems.append("no tokenizer: tokenizer_path or builtin is required")
            return None, None
        return spec.tokenizer_path, None
    if spec.tokenizer_path:
        problems.append(f"builtin {spec.builtin!r} and tokenizer {spec.tokenizer_path} both "
                        "given: name one of them")
        return None, None
    files = builtin_files(spec.builtin, problems)
    return (None, None) if files is None else (files.tokenizer_path, files.chat_template)


def _model_files(path: str | None, problems: list[str]) -> tuple[str | None, HfSettings]:
    """``tokenizer.json``'s path and the settings of the directory it sits in."""
    if path is None:
        return None, HfSettings()
    if os.path.isdir(path):
        return os.path.join(path, TOKENIZER_FILE), read_hf_settings(Path(path), problems)
    return path, read_hf_settings(Path(path).parent, problems)


def _template_sources(
    spec: ProfileSpec, settings: HfSettings, builtin_template: str | None, problems: list[str]
) -> dict[str, str]:
    """The model's templates by name: the configured file's, else the builtin's, else the
    tokenizer directory's."""
    path = spec.chat_template_path
    if path is None:
        if builtin_template is not None:
            return {"default": builtin_template}
        return settings.chat_templates
    if os.path.isdir(path):
        templates = read_hf_settings(Path(path), problems).chat_templates
        if not templates:
            problems.append(f"chat template {path}: the directory has no chat template")
        return templates
    raw = _read(path, "chat template", problems)
    if raw is None:
        return {}
    try:
        text = raw.decode()
        if not path.endswith(".json"):
            return {"default": text}
        value = json.loads(text).get("chat_template")
        if value is None:
            raise ValueError("no chat_template in the file")
        return named_templates(value)
    except (UnicodeDecodeError, ValueError, AttributeError) as exc:
        problems.append(f"chat template {path}: {exc}")
        return {}


def _compile(
    sources: dict[str, str], tokens: dict[str, str], origin: str | None, problems: list[str]
) -> ChatTemplates | None:
    if not sources:
        return None
    compiled: dict[str, ChatTemplate] = {}

    def template(source: str | None) -> ChatTemplate | None:
        if source is None:
            return None
        if source not in compiled:
            compiled[source] = ChatTemplate(source, tokens)
        return compiled[source]

    try:
        default = template(pick_template(sources, tools=False))
        tool_use = template(pick_template(sources, tools=True))
    except Exception as exc:  # noqa: BLE001 - syntax or encoding errors alike
        problems.append(f"chat template {origin}: {exc}")
        return None
    if default is None and tool_use is None:
        problems.append(f"chat templates {sorted(sources)} in {origin}: none is named "
                        "'default'")
        return None
    return ChatTemplates(default, tool_use)


def template_identity(sources: dict[str, str], tokens: dict[str, str]) -> str | None:
    """What the chat templates render from, as one string (the fingerprint's template part):
    the named sources and the special tokens they get; ``None`` without a template."""
    if not sources:
        return None
    return json.dumps({"templates": sources, "tokens": tokens}, sort_keys=True)


def _adds_bos(
    tokenizer: Tokenizer, settings: HfSettings, bos_id: int | None, problems: list[str]
) -> tuple[bool, int | None]:
    """Whether the tokenizer puts BOS before a text tokenized with special tokens, and its id.

    A ``tokenizer.json`` with a post-processor decides (probed: what it adds around a text);
    without one, transformers builds it from ``add_bos_token`` / ``add_eos_token``.
    """
    if tokenizer.post_processor is None:
        if settings.add_eos_token:
            problems.append("add_eos_token: EOS after text tokenized with special tokens "
                            "is not supported (set add_bos explicitly to route such text)")
        return bool(settings.add_bos_token) and bos_id is not None, bos_id
    probe = "cortex probe"
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe, add_special_tokens=True).ids
    at = next((i for i in range(len(full) - len(plain) + 1)
               if full[i:i + len(plain)] == plain), None)
    if at is None or len(full) - len(plain) - at or at > 1:
        problems.append(f"the tokenizer's post-processor puts {full} around {plain}: only a "
                        "single leading BOS is supported (set add_bos explicitly)")
        return False, None
    return (True, full[0]) if at == 1 else (False, None)


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
