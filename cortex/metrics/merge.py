"""One ``/metrics`` body from the expositions of several processes of one service.

``server.processes`` > 1 runs that many Cortex processes behind one control plane
(``cortex.processes``); each keeps its own counters, ledger and view of the workers. The
control plane's ``/metrics`` shows them all, each sample labelled with the process it came
from (``process="0"`` is the one serving the control plane), so a dashboard sums them
(``sum without (process)``) or tells them apart.

Rules:

* Input: ``(process, text)`` pairs, each a text exposition (format 0.0.4) as
  ``CortexMetrics.render`` writes it: a family is a ``# HELP`` line, its ``# TYPE`` line, then
  its samples; a family appears once per text.
* Output: each family once — its ``HELP``/``TYPE`` lines from the first text that has it, in
  the order families are first seen — followed by every text's samples of it, in input order,
  with ``process="<process>"`` as their first label. Samples before any ``# HELP`` form a
  family without a header (CortexMetrics writes none).
* A text that is not an exposition (empty, cut) contributes whatever whole lines it has; the
  merge never raises on content.

Pure: bytes in, bytes out; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

_HELP = b"# HELP "


def _families(text: bytes) -> list[tuple[bytes, list[bytes], list[bytes]]]:
    """``(name, header lines, sample lines)`` per family, in order."""
    families: list[tuple[bytes, list[bytes], list[bytes]]] = []
    header: list[bytes] = []
    samples: list[bytes] = []
    name = b""
    for line in text.split(b"\n"):
        if not line:
            continue
        if line.startswith(_HELP):
            if header or samples:
                families.append((name, header, samples))
            name = line[len(_HELP):].split(b" ", 1)[0]
            header, samples = [line], []
        elif line.startswith(b"#"):
            header.append(line)
        else:
            samples.append(line)
    if header or samples:
        families.append((name, header, samples))
    return families


def labelled(sample: bytes, label: bytes) -> bytes:
    """``sample`` with ``label`` (``key="value"``) as its first label."""
    brace = sample.find(b"{")
    space = sample.find(b" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = sample[brace + 1:]
        return sample[:brace + 1] + label + (b"," + rest if not rest.startswith(b"}")
                                             else rest)
    if space == -1:
        return sample
    return sample[:space] + b"{" + label + b"}" + sample[space:]


def merge_expositions(texts: Sequence[tuple[str, bytes]]) -> bytes:
    """One exposition of every ``(process, text)`` (module rules)."""
    order: list[bytes] = []
    headers: dict[bytes, list[bytes]] = {}
    samples: dict[bytes, list[bytes]] = {}
    for process, text in texts:
        label = b'process="' + process.encode() + b'"'
        for name, header, lines in _families(text):
            if name not in headers:
                order.append(name)
                headers[name] = header
                samples[name] = []
            samples[name].extend(labelled(line, label) for line in lines)
    out: list[bytes] = []
    for name in order:
        out.extend(headers[name])
        out.extend(samples[name])
    return b"\n".join(out) + b"\n" if out else b""
