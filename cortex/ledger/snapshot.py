"""Ledger snapshots: one replica's ledger, per engine stream, for a peer to warm-start from.

Pure: no I/O (msgspec msgpack in and out). ``GET /admin/ledger/snapshot`` serves
``encode(take_snapshot(...))``; a starting replica ``decode``s it and hands each matching
stream's ``TargetImage`` to its ingestion, which loads it and lets the sync machine prove it
continuous (``TargetSync.start_from_snapshot``) or discard it.

Rules:

* A stream is named independently of the replica (``StreamId``): worker URL, DP rank, engine
  family, model, the rank's event endpoint and topic — never Cortex's target ids, which are
  local. Worker names are carried for the logs only (replicas may name workers differently).
* Only targets whose ledger is READY, follows the stream with nothing pending and has applied
  at least one batch are exported (``TargetSync.resume_point``): with the ledger image go the
  last applied sequence number and that batch's payload digest, which the peer's replay must
  show again. Every other target is listed in ``skipped`` with its state and why (a peer
  starts those the normal way).
* Consistency: the caller takes the snapshot synchronously on the trio thread, between two
  applies (no checkpoint inside), so every target's image matches its resume point.
* Block keys are Cortex's own chained keys, namespaced by model (and LoRA, cache salt), so an
  image is valid for any replica with the same model name and block size; ``KEY_SCHEME``
  names the key function and a snapshot of another scheme or ``FORMAT`` is refused.
* Arrays are little-endian on the wire (converted from and to native order here).
* ``decode`` raises ``SnapshotError`` for anything malformed: bad msgpack, wrong types,
  unknown format, array lengths that are not whole items or disagree.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from cortex.errors import CortexError

FORMAT = 1
KEY_SCHEME = "xxh3-64-chained-v1"
_LITTLE = sys.byteorder == "little"


class SnapshotError(CortexError):
    """A snapshot that cannot be used (malformed, another format, too large)."""

    http_status = 502


class StreamId(msgspec.Struct, frozen=True):
    url: str  # the worker's HTTP base URL
    rank: int  # DP rank
    engine: str  # "vllm" | "sglang"
    model: str
    events: str  # this rank's event endpoint
    topic: str = ""


class TreeImage(msgspec.Struct, frozen=True):
    """One tree's part of a target (``BlockTree.export_target``), little-endian arrays."""

    block_size: int
    node_keys: bytes  # u64 per node, parents before children
    node_parents: bytes  # u32 per node: 1 + the parent's index, 0 for a root
    entry_hashes: bytes  # u64 per entry: the engine's block hash
    entry_nodes: bytes  # u32 per entry: index of the node it names
    entry_refs: bytes  # u32 per entry: refcount per medium, one byte each


class TargetImage(msgspec.Struct, frozen=True):
    stream: StreamId
    worker: str
    state: str  # always "ready" (others are skipped)
    last_seq: int  # the last batch applied
    last_digest: bytes  # its payload digest (``payload_digest``)
    trees: tuple[TreeImage, ...] = ()

    def images(self) -> dict[int, tuple[bytes, bytes, bytes, bytes, bytes]]:
        """Block size -> native-order arrays, as ``LedgerBook.import_target`` takes them."""
        return {tree.block_size: (_native(tree.node_keys, "Q"), _native(tree.node_parents, "I"),
                                  _native(tree.entry_hashes, "Q"), _native(tree.entry_nodes, "I"),
                                  _native(tree.entry_refs, "I"))
                for tree in self.trees}

    @property
    def entries(self) -> int:
        return sum(len(tree.entry_hashes) // 8 for tree in self.trees)


class SkippedTarget(msgspec.Struct, frozen=True):
    stream: StreamId
    worker: str
    state: str
    reason: str


class LedgerSnapshot(msgspec.Struct, frozen=True):
    format: int
    key_scheme: str
    targets: tuple[TargetImage, ...] = ()
    skipped: tuple[SkippedTarget, ...] = ()

    def by_stream(self) -> dict[StreamId, TargetImage]:
        return {image.stream: image for image in self.targets}


@dataclass(frozen=True, slots=True)
class ExportedTarget:
    """What the application knows of one target when taking a snapshot."""

    stream: StreamId
    worker: str
    state: str
    resume_point: tuple[int, bytes] | None  # ``TargetSync.resume_point``; None: not exportable
    images: dict[int, tuple[bytes, bytes, bytes, bytes, bytes]] | None  # None: not exported


def take_snapshot(targets: Iterable[ExportedTarget]) -> LedgerSnapshot:
    exported: list[TargetImage] = []
    skipped: list[SkippedTarget] = []
    for target in targets:
        if target.state != "ready" or target.resume_point is None or target.images is None:
            why = ("not ready" if target.state != "ready"
                   else "no batch applied yet, or a replay pending")
            skipped.append(SkippedTarget(target.stream, target.worker, target.state, why))
            continue
        seq, digest = target.resume_point
        trees = tuple(
            TreeImage(size, _wire(keys, "Q"), _wire(parents, "I"), _wire(hashes, "Q"),
                      _wire(nodes, "I"), _wire(refs, "I"))
            for size, (keys, parents, hashes, nodes, refs) in sorted(target.images.items()))
        exported.append(TargetImage(target.stream, target.worker, target.state, seq, digest,
                                    trees))
    return LedgerSnapshot(FORMAT, KEY_SCHEME, tuple(exported), tuple(skipped))


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(LedgerSnapshot)


def encode(snapshot: LedgerSnapshot) -> bytes:
    return _ENCODER.encode(snapshot)


def decode(data: bytes) -> LedgerSnapshot:
    """The snapshot in ``data``, checked (rules above); ``SnapshotError`` otherwise."""
    try:
        snapshot = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise SnapshotError(f"malformed ledger snapshot: {error}") from None
    if snapshot.format != FORMAT or snapshot.key_scheme != KEY_SCHEME:
        raise SnapshotError(f"ledger snapshot format {snapshot.format} / keys "
                            f"{snapshot.key_scheme!r}; this Cortex reads {FORMAT} / {KEY_SCHEME!r}")
    problems = []
    for image in snapshot.targets:
        label = f"{image.worker} rank {image.stream.rank}"
        if image.last_seq < 0 or not image.last_digest:
            problems.append(f"{label}: no resume point")
        for tree in image.trees:
            nodes, rem_k = divmod(len(tree.node_keys), 8)
            entries, rem_h = divmod(len(tree.entry_hashes), 8)
            if (rem_k or rem_h or tree.block_size < 1
                    or len(tree.node_parents) != 4 * nodes
                    or len(tree.entry_nodes) != 4 * entries
                    or len(tree.entry_refs) != 4 * entries):
                problems.append(f"{label}: tree of block size {tree.block_size}: arrays of "
                                "inconsistent lengths")
    if problems:
        raise SnapshotError("malformed ledger snapshot: " + "; ".join(problems))
    return snapshot


def _wire(native: bytes, code: str) -> bytes:
    if _LITTLE:
        return native
    items = array(code, native)
    items.byteswap()
    return items.tobytes()


_native = _wire  # a byte swap is its own inverse
