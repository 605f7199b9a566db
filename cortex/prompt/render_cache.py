"""Render a conversation paying only for the messages not rendered before — exactly.

A chat template renders a whole conversation; an agent's next turn resends it with a few new
messages, and a full render costs every message again (~10-30 µs each through Jinja's sandbox,
plus the engine's per-message conversion). ``RenderCache`` keeps each rendered conversation's
text and where each message's output starts in it, and renders only a *window* of a longer
conversation whose earlier messages it has seen.

When it is exact (``locality``, a static reading of the template's Jinja syntax tree): the
template has exactly one top-level ``{% for message in messages %}`` (no filter, ``else``,
recursion or ``break`` of it), and reads the conversation only as ``messages[0]`` or, inside
that loop, as ``messages[loop.index0 ± c]`` / ``loop.previtem`` / ``loop.nextitem`` (at most
``left`` messages back, ``right`` ahead), ``loop.first`` / ``loop.last``, and ``loop.index0`` /
``loop.index`` only inside such subscripts, compared for equality with the first position, or
taken modulo 2; no namespace attribute is set inside the loop or a macro (the only state that
outlives an iteration: a plain ``set`` there is reset each iteration), no ``strftime_now`` (time),
``cycler`` / ``joiner`` (state across calls) or ``random`` filter, no ``include`` / ``import`` /
``extends`` / ``block``. Then the output is: a head that reads only
``messages[0]`` and the globals; per message, output that reads only the message, its
neighbours within ``left`` / ``right``, ``messages[0]``, whether it is first or last, the parity
of its position and the globals; a tail that reads only ``messages[0]`` and the globals. A
template not shown local is rendered whole every time, counted (``not_local`` says why).

The window: for a conversation ``M`` of ``n`` messages whose first ``k`` messages (and
globals: tools, documents, template kwargs, ``add_generation_prompt``) equal a cached
conversation's, the output of every message before ``s = k - max(right, 1)`` is the cached text
up to where message ``s`` starts (each of them sees the same neighbours and is last in neither).
The rest comes from rendering ``W = [M[0]] + M[a:]``, ``a`` odd (an even number of messages
dropped: positions keep their parity) and ``a <= s - left``: from where ``M[s]`` starts in
``W``'s output to its end, tail included (every message from ``s`` on sees in ``W`` what it sees
in ``M``). Where a message's output starts is recorded while rendering: the template's loop
advances over a ``TracedMessages`` list (or its ``LoopContext``, patched to record) while the
consumer extends a list from the generator (in C: the parts received so far are counted). A
render that indexes the conversation with a negative number (a template that reads
``messages[loop.index0 - 1]`` at the first message reads the *last* one) turns the cache off
for the template (its earlier results were whole renders; nothing stale is kept).

Finding a cached conversation: entries are filed by their message count and an outline of their
last message (role, sizes, a few characters: cheap, never trusted alone); for each of the last
``LOOK_BACK`` prefix lengths of a request the bucket's entries are compared for equality with
the request's messages and scope (the client's parsed JSON: strings compare by length, then
memory — nothing is hashed, so no collision can give a wrong text; a different spelling of a
message is a miss). A full compare costs microseconds where hashing every byte cost more than
rendering a conversation of few long messages whole (measured, ``perf/bench_route_turns.py``).

Bound: an LRU of buckets by bytes (an entry is charged twice its text's size — the text, and the
client's messages it keeps — plus 8 bytes per message start), ``BUCKET_ENTRIES`` per bucket;
``capacity_bytes`` 0 keeps nothing. Counters: ``renders`` by kind — ``same`` (the conversation
seen whole), ``window``, ``full`` (nothing cached to start from), ``short`` (a conversation
whose whole render, at the per-message cost measured on this template's whole renders, costs
less than the window's copies of the cached text, ``WINDOW_S_PER_BYTE``: rendered whole,
untraced, not kept), ``fallback`` (media, or the cache turned off). Pure (the clock read for
that cost aside) and single-owner (the event loop).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from jinja2 import nodes

__all__ = ["Locality", "RenderCache", "TracedMessages", "locality"]

log = logging.getLogger("cortex.profile")

_ENTRY_OVERHEAD = 200  # an entry's fixed charge: the dict slot, the entry, its lists


@dataclass(frozen=True, slots=True)
class Locality:
    left: int  # messages before one that its output may read
    right: int  # messages after it
    loop_context: bool  # the loop reads ``loop``: Jinja's LoopContext iterates the messages


class TracedMessages(list):
    """The conversation handed to a traced render: records where each message's output starts
    (``starts``: first as the number of output parts received by then — the consumer extends
    ``parts`` from the render's generator in C — then, ``finish``, as character offsets) and
    whether a negative index was read."""

    __slots__ = ("in_iter", "negative", "parts", "starts")

    def __init__(self, messages: Sequence[Any], in_iter: bool) -> None:
        super().__init__(messages)
        self.in_iter = in_iter  # record when the template's plain loop takes the next one
        self.parts: list[str] = []  # the output so far
        self.starts: list[int] = []
        self.negative = False

    def finish(self) -> str:
        """The output; ``starts`` become character offsets."""
        ends = [0, *accumulate(map(len, self.parts))]
        self.starts = [ends[count] for count in self.starts]
        return "".join(self.parts)

    def __iter__(self) -> Iterator[Any]:
        if not self.in_iter:
            return list.__iter__(self)
        return self._recording()

    def _recording(self) -> Iterator[Any]:
        for message in list.__iter__(self):
            self.starts.append(len(self.parts))
            yield message

    def __getitem__(self, index):  # type: ignore[override]
        if type(index) is int and index < 0:
            self.negative = True
        return list.__getitem__(self, index)


def traced_loop_context(base: type) -> type:
    """``base`` (Jinja's ``LoopContext``) recording each step over a ``TracedMessages`` (its
    iterator may run ahead: ``loop.last`` peeks)."""

    class TracedLoopContext(base):  # type: ignore[misc, valid-type]
        def __next__(self) -> Any:
            step = super().__next__()
            messages = self._iterable
            if type(messages) is TracedMessages:
                messages.starts.append(len(messages.parts))
            return step

    return TracedLoopContext


# -- the static reading -------------------------------------------------------------------------

_FIRST_POSITION = {"index0": 0, "index": 1}  # each position attribute's value at the first
_NEIGHBOURS = {"previtem": -1, "nextitem": 1}
_STATEFUL_GLOBALS = frozenset({"cycler", "joiner"})  # Jinja's: each call depends on the last


def locality(tree: nodes.Template) -> Locality | str:
    """The template's ``Locality``, or why it cannot be shown (module docstring)."""
    for kind in (nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport, nodes.Block):
        if tree.find(kind) is not None:
            return f"the template uses {kind.__name__.lower()}"
    loops = [node for node in tree.body
             if isinstance(node, nodes.For) and _is_messages(node.iter)]
    if len(loops) != 1:
        return "no single top-level loop over messages"
    loop = loops[0]
    if (not isinstance(loop.target, nodes.Name) or loop.test is not None or loop.recursive
            or loop.else_):
        return "the loop over messages unpacks, filters, recurses or has an else"
    reader = _Reader(loop)
    reader.visit(tree, (), ())
    return reader.why_not if reader.why_not is not None else Locality(
        reader.left, reader.right, reader.uses_loop)


def _is_messages(node: nodes.Node | None) -> bool:
    return isinstance(node, nodes.Name) and node.name == "messages"


class _Reader:
    """Walks the tree once, with each node's ancestors and its enclosing ``for`` loops."""

    def __init__(self, loop: nodes.For) -> None:
        self.loop = loop
        self.left = self.right = 0
        self.uses_loop = False
        self.why_not: str | None = None

    def fail(self, why: str) -> None:
        if self.why_not is None:
            self.why_not = why

    def visit(self, node: nodes.Node, up: tuple[nodes.Node, ...],
              fors: tuple[nodes.For, ...]) -> None:
        ours = bool(fors) and fors[-1] is self.loop  # a `loop` here is the messages loop's
        if isinstance(node, nodes.Name):
            if node.name == "strftime_now":
                self.fail("it reads the time (strftime_now)")
            elif node.name in _STATEFUL_GLOBALS:
                self.fail(f"it uses {node.name}() (state across calls)")
            elif node.name == "messages":
                self._messages(node, up, ours)
            elif node.name == "loop" and ours:
                self.uses_loop = True
                if not (up and isinstance(up[-1], nodes.Getattr)):
                    self.fail("the loop object itself is used")
        elif isinstance(node, nodes.Getattr) and ours and isinstance(
                node.node, nodes.Name) and node.node.name == "loop":
            self._loop_attribute(node, up)
        elif isinstance(node, nodes.Filter) and node.name == "random":
            self.fail("it draws at random (the random filter)")
        elif isinstance(node, nodes.Break) and ours:
            self.fail("a break out of the loop over messages")
        elif isinstance(node, nodes.NSRef) and (self.loop in fors or any(
                isinstance(above, nodes.Macro) for above in up)):
            # a macro may be called from the loop: its namespace writes would outlive it too
            self.fail("a namespace attribute is set inside the loop over messages or a macro")
        below = (*up, node)
        if isinstance(node, nodes.For):
            # its iterable (and filter) belong to the enclosing scope; its body to the loop
            for child in (node.target, node.iter, node.test):
                if child is not None:
                    self.visit(child, below, fors)
            for child in (*node.body, *node.else_):
                self.visit(child, below, (*fors, node))
            return
        for child in node.iter_child_nodes():
            self.visit(child, below, fors)

    def _messages(self, node: nodes.Name, up: tuple[nodes.Node, ...], ours: bool) -> None:
        parent = up[-1] if up else None
        if parent is self.loop and node is self.loop.iter:
            return
        if not isinstance(parent, nodes.Getitem) or parent.node is not node:
            self.fail("the conversation is read whole (a filter, a test, a slice, ...)")
            return
        arg = parent.arg
        if isinstance(arg, nodes.Const) and arg.value == 0 and type(arg.value) is int:
            return
        offset = _offset(arg) if ours else None
        if offset is None:
            self.fail("a message is read by an index other than 0 or loop.index0 ± c")
        elif offset < 0:
            self.left = max(self.left, -offset)
        else:
            self.right = max(self.right, offset)

    def _loop_attribute(self, node: nodes.Getattr, up: tuple[nodes.Node, ...]) -> None:
        attr = node.attr
        if attr in ("first", "last"):
            return
        if attr in _NEIGHBOURS:
            step = _NEIGHBOURS[attr]
            self.left, self.right = max(self.left, -step), max(self.right, step)
            return
        if attr not in _FIRST_POSITION:
            self.fail(f"loop.{attr} depends on the conversation's length or history")
            return
        parent = up[-1] if up else None
        grand = up[-2] if len(up) > 1 else None
        for holder, arg in ((parent, node), (grand, parent)):  # messages[loop.index0 (± c)]
            if isinstance(holder, nodes.Getitem) and _is_messages(holder.node) and (
                    holder.arg is arg) and _offset(arg) is not None:
                return
        first = _FIRST_POSITION[attr]
        if isinstance(parent, nodes.Compare) and parent.expr is node and len(parent.ops) == 1:
            operand = parent.ops[0]
            if (isinstance(operand.expr, nodes.Const) and operand.expr.value == first
                    and operand.op in ("eq", "ne", "gt")):
                return  # whether it is the first message: the window's first is M[0] too
        if isinstance(parent, nodes.Mod) and parent.left is node and isinstance(
                parent.right, nodes.Const) and parent.right.value == 2:
            return  # its parity: the window leaves out an even number of messages
        self.fail(f"loop.{attr} is used as a number (the window renumbers messages)")


def _offset(arg: nodes.Node) -> int | None:
    """``c`` of a subscript ``loop.index0 ± c`` (``loop.index`` counts one more)."""
    if isinstance(arg, nodes.Getattr):
        return _position(arg)
    if isinstance(arg, (nodes.Add, nodes.Sub)):
        sign = 1 if isinstance(arg, nodes.Add) else -1
        pairs = [(arg.left, arg.right)] + ([(arg.right, arg.left)] if sign == 1 else [])
        for position, const in pairs:
            base = _position(position) if isinstance(position, nodes.Getattr) else None
            if base is not None and isinstance(const, nodes.Const) and type(
                    const.value) is int:
                return base + sign * const.value
    return None


def _position(node: nodes.Getattr) -> int | None:
    if isinstance(node.node, nodes.Name) and node.node.name == "loop" and (
            node.attr in _FIRST_POSITION):
        return _FIRST_POSITION[node.attr]
    return None


# -- the cache ----------------------------------------------------------------------------------

@dataclass(slots=True)
class _Entry:
    raw: list[Any]  # the client's messages, as parsed (compared, never changed)
    scope: object  # everything else the template read (compared)
    text: str
    starts: list[int]  # where each message's output starts in ``text``
    last: dict[str, Any]  # the last message as the template got it
    charge: int


Render = Callable[[list[dict[str, Any]]], tuple[str, TracedMessages]]
Convert = Callable[[list[Any]], tuple[list[dict[str, Any]], bool]]
BUCKET_ENTRIES = 4  # conversations kept per (length, last message's outline)
# The window copies the cached text twice (slice, concatenation) and compares the messages:
# ~0.7 ns per byte of the cached text here. A conversation whose whole render is estimated to
# cost less (its message count times the seconds per message measured on this template's whole
# renders) is rendered whole, untraced, and not kept: the builtin DeepSeek template, 44 messages
# of ~2.3k tokens, costs 82 µs whole against 194 µs through the cache; Qwen2.5's with tools,
# 162 short messages, 3.7 ms whole against 0.7 ms (perf/RESULTS.md).
WINDOW_S_PER_BYTE = 0.7e-9
MEASURED_MIN_MESSAGES = 8  # whole renders of fewer messages do not count in the per-message cost
LOOK_BACK = 8  # how many messages a new request may add to a cached conversation and find it


class RenderCache:
    def __init__(self, shape: Locality, capacity_bytes: int = 32 << 20) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.shape = shape
        self.capacity_bytes = capacity_bytes
        self.cached_bytes = 0
        self.off: str | None = None  # why the cache was turned off (a negative index)
        self.renders = {"same": 0, "window": 0, "full": 0, "short": 0, "fallback": 0}
        self.whole_s_per_message: float | None = None  # measured on whole renders (EWMA)
        self.window_s_per_byte = WINDOW_S_PER_BYTE
        # (message count, the last message's outline) -> its conversations, newest last;
        # the dict's own order is the LRU of buckets
        self._buckets: OrderedDict[tuple[int, object], list[_Entry]] = OrderedDict()
        self._hold = max(shape.right, 1)

    def render(self, raw: list[Any], scope: object, convert: Convert, render: Render,
               plain: Callable[[list[dict[str, Any]]], str]) -> tuple[str, dict[str, Any]] | None:
        """The text of the conversation ``raw`` (the client's messages) and its last message as
        the template got it; ``None`` when the caller must render it whole itself (media, the
        cache off). ``convert`` makes the template's messages of client messages (and says
        whether media cut them); ``render`` renders template messages, traced, ``plain`` the
        same untraced; ``scope`` is everything else the template reads (compared)."""
        if self.off is not None or not raw:
            self.renders["fallback"] += 1
            return None
        n = len(raw)
        seen, entry = 0, None
        for j in range(n, max(n - LOOK_BACK, 0), -1):  # the longest conversation seen
            entry = self._find(raw, j, scope)
            if entry is not None:
                seen = j
                break
        if entry is not None and seen == n:
            self.renders["same"] += 1
            return entry.text, entry.last
        if entry is not None and n >= MEASURED_MIN_MESSAGES and self._cheaper_whole(n, entry):
            return self._short(raw, convert, plain)
        start = seen - self._hold  # messages before it: their output as cached
        first = start - self.shape.left
        first -= (first - 1) % 2  # odd: an even number of messages left out, parity kept
        if entry is None or first < 3:
            return self._full(raw, scope, convert, render)
        window = self._converted([raw[0], *raw[first:]], convert)
        if window is None:
            return None
        text, traced = render(window)
        if traced.negative:
            return self._turn_off()
        at = start - first + 1  # M[start]'s position in the window
        base = entry.starts[start]
        offset = traced.starts[at]
        result = entry.text[:base] + text[offset:]
        starts = entry.starts[:start] + [base + p - offset for p in traced.starts[at:]]
        self._remember(raw, scope, result, starts, window[-1])
        self.renders["window"] += 1
        return result, window[-1]

    def _cheaper_whole(self, n: int, entry: _Entry) -> bool:
        """Whether rendering ``n`` messages whole is estimated cheaper than the window's
        copies of ``entry``'s text (not measured yet: measure it, unless windows are free)."""
        per_message = self.whole_s_per_message
        if per_message is None:
            return self.window_s_per_byte > 0
        return n * per_message < sys.getsizeof(entry.text) * self.window_s_per_byte

    def _short(self, raw: list[Any], convert: Convert,
               plain: Callable[[list[dict[str, Any]]], str]) -> tuple[str, dict[str, Any]] | None:
        """Rendered whole, untraced, not kept (cheaper than the window)."""
        started = time.perf_counter()
        messages = self._converted(raw, convert)
        if messages is None:
            return None
        text = plain(messages)
        self._measured(time.perf_counter() - started, len(raw))
        self.renders["short"] += 1
        return text, messages[-1]

    def _converted(self, raw: list[Any], convert: Convert) -> list[dict[str, Any]] | None:
        """The template's messages of ``raw``; ``None`` (counted) when media cut them."""
        messages, media = convert(raw)
        if media:
            self.renders["fallback"] += 1
            return None
        return messages

    def _measured(self, seconds: float, messages: int) -> None:
        if messages < MEASURED_MIN_MESSAGES:
            return  # a render's fixed cost would weigh as much as its messages'
        per_message = seconds / messages
        known = self.whole_s_per_message
        self.whole_s_per_message = per_message if known is None else (
            0.8 * known + 0.2 * per_message)

    def _find(self, raw: list[Any], count: int, scope: object) -> _Entry | None:
        """The cached conversation equal to ``raw[:count]`` under ``scope``, if any."""
        key = (count, _outline(raw[count - 1]))
        bucket = self._buckets.get(key)
        if bucket is None:
            return None
        for entry in reversed(bucket):
            # equal objects: strings compare by length, then memory (no hash to collide)
            if entry.scope == scope and entry.raw == (raw if count == len(raw)
                                                      else raw[:count]):
                self._buckets.move_to_end(key)
                return entry
        return None

    def _full(self, raw: list[Any], scope: object, convert: Convert,
              render: Render) -> tuple[str, dict[str, Any]] | None:
        started = time.perf_counter()
        messages = self._converted(raw, convert)
        if messages is None:
            return None
        text, traced = render(messages)
        if traced.negative:
            return self._turn_off()
        self._measured(time.perf_counter() - started, len(raw))
        self._remember(raw, scope, text, traced.starts, messages[-1])
        self.renders["full"] += 1
        return text, messages[-1]

    def _turn_off(self) -> None:
        self.off = ("the template read messages[-1] from inside its loop (the last message, "
                    "from the first one)")
        log.warning("chat render cache off: %s; every conversation is rendered whole",
                    self.off)
        self._buckets.clear()
        self.cached_bytes = 0
        self.renders["fallback"] += 1

    def _remember(self, raw: list[Any], scope: object, text: str, starts: list[int],
                  last: dict[str, Any]) -> None:
        # charged for the text twice: the cached text, and the messages it keeps alive
        charge = 2 * sys.getsizeof(text) + 8 * len(starts) + _ENTRY_OVERHEAD
        if charge > self.capacity_bytes:
            return
        key = (len(raw), _outline(raw[-1]))
        bucket = self._buckets.setdefault(key, [])
        self._buckets.move_to_end(key)
        for index, old in enumerate(bucket):
            if old.scope == scope and old.raw == raw:
                del bucket[index]
                self.cached_bytes -= old.charge
                break
        bucket.append(_Entry(list(raw), scope, text, starts, last, charge))
        self.cached_bytes += charge
        if len(bucket) > BUCKET_ENTRIES:
            self.cached_bytes -= bucket.pop(0).charge
        while self.cached_bytes > self.capacity_bytes:
            oldest_key, oldest = next(iter(self._buckets.items()))
            self.cached_bytes -= oldest.pop(0).charge
            if not oldest:
                del self._buckets[oldest_key]


def _outline(message: Any) -> object:
    """A cheap bucket key of a message (equal messages, equal outlines; never trusted alone)."""
    if type(message) is not dict:
        return None
    role = message.get("role")
    if type(role) is not str:  # (a client's list there must not make the key unhashable)
        role = None
    content = message.get("content")
    if type(content) is str:
        return (role, len(message), len(content), content[:16], content[-16:])
    return (role, len(message), type(content).__name__)
