"""An SVG chart of a replay comparison, written by hand (no plotting dependency).

``chart_svg(result) -> str`` for a ``replay.compare(..., keep_results=True)`` result: left, the
TTFT distribution of each router (empirical CDF, log-scaled time axis); right, requests per
worker for each router (grouped bars, the mean of the router's own workers as a dashed line;
a prefill/decode run counts each worker's legs: prefill legs on prefill engines, decode legs on
decode engines). Pure: text in, text out.
"""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 1000, 420
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
PLOT_TOP, PLOT_BOTTOM = 50, 360


def _ttfts(run: dict) -> list[float]:
    return sorted(r["ttft_s"] * 1000 for r in run.get("results", []) if r["status"] == 200)


def _cdf(result: dict, x0: int, x1: int) -> list[str]:
    runs = result["routers"]
    values = [v for run in runs.values() for v in _ttfts(run)]
    if not values:
        return []
    lo = max(1.0, min(values))
    hi = max(values) * 1.05
    span = math.log10(hi) - math.log10(lo) or 1.0

    def x(ms: float) -> float:
        return x0 + (math.log10(max(ms, lo)) - math.log10(lo)) / span * (x1 - x0)

    def y(q: float) -> float:
        return PLOT_BOTTOM - q * (PLOT_BOTTOM - PLOT_TOP)

    out = [f'<text x="{(x0 + x1) / 2}" y="30" text-anchor="middle" font-size="15">'
           f'Time to first token (CDF)</text>',
           f'<line x1="{x0}" y1="{PLOT_BOTTOM}" x2="{x1}" y2="{PLOT_BOTTOM}" stroke="#333"/>',
           f'<line x1="{x0}" y1="{PLOT_TOP}" x2="{x0}" y2="{PLOT_BOTTOM}" stroke="#333"/>']
    for q in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0):
        out.append(f'<line x1="{x0}" y1="{y(q):.1f}" x2="{x1}" y2="{y(q):.1f}" '
                   f'stroke="#ddd"/><text x="{x0 - 6}" y="{y(q) + 4:.1f}" font-size="11" '
                   f'text-anchor="end">{q:g}</text>')
    tick = 10 ** math.floor(math.log10(lo))
    while tick <= hi:
        for m in (1, 2, 5):
            ms = tick * m
            if lo <= ms <= hi:
                out.append(f'<line x1="{x(ms):.1f}" y1="{PLOT_BOTTOM}" x2="{x(ms):.1f}" '
                           f'y2="{PLOT_BOTTOM + 5}" stroke="#333"/><text x="{x(ms):.1f}" '
                           f'y="{PLOT_BOTTOM + 18}" font-size="11" text-anchor="middle">'
                           f'{ms:g}</text>')
        tick *= 10
    out.append(f'<text x="{(x0 + x1) / 2}" y="{PLOT_BOTTOM + 36}" font-size="12" '
               f'text-anchor="middle">TTFT, ms (log scale)</text>')
    for i, (name, run) in enumerate(runs.items()):
        ttft = _ttfts(run)
        n = len(ttft)
        points = " ".join(f"{x(v):.1f},{y((k + 1) / n):.1f}" for k, v in enumerate(ttft))
        color = COLORS[i % len(COLORS)]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                   f'points="{points}"/>')
        out.append(f'<text x="{x0 + 10}" y="{PLOT_TOP + 16 + 16 * i}" font-size="12" '
                   f'fill="{color}">{escape(name)}: p50 {run["ttft_ms"]["p50"]:.0f} ms, '
                   f'p99 {run["ttft_ms"]["p99"]:.0f} ms</text>')
    return out


def _bars(result: dict, x0: int, x1: int) -> list[str]:
    runs = result["routers"]
    workers = sorted({w for run in runs.values() for w in run["per_worker"]})
    if not workers:
        return []
    top = max(max(run["per_worker"].values(), default=0) for run in runs.values()) or 1
    group = (x1 - x0) / len(workers)
    bar = group * 0.8 / len(runs)

    def y(count: float) -> float:
        return PLOT_BOTTOM - count / top * (PLOT_BOTTOM - PLOT_TOP - 20)

    out = [f'<text x="{(x0 + x1) / 2}" y="30" text-anchor="middle" font-size="15">'
           f'Requests per worker</text>',
           f'<line x1="{x0}" y1="{PLOT_BOTTOM}" x2="{x1}" y2="{PLOT_BOTTOM}" stroke="#333"/>']
    for k, worker in enumerate(workers):
        out.append(f'<text x="{x0 + group * (k + 0.5):.1f}" y="{PLOT_BOTTOM + 18}" '
                   f'font-size="11" text-anchor="middle">{escape(worker)}</text>')
    for i, (name, run) in enumerate(runs.items()):
        color = COLORS[i % len(COLORS)]
        for k, worker in enumerate(workers):
            count = run["per_worker"].get(worker, 0)
            left = x0 + group * k + group * 0.1 + bar * i
            out.append(f'<rect x="{left:.1f}" y="{y(count):.1f}" width="{bar:.1f}" '
                       f'height="{PLOT_BOTTOM - y(count):.1f}" fill="{color}"/>')
        mean = sum(run["per_worker"].values()) / max(len(run["per_worker"]), 1)  # own workers
        out.append(f'<line x1="{x0}" y1="{y(mean):.1f}" x2="{x1}" y2="{y(mean):.1f}" '
                   f'stroke="{color}" stroke-dasharray="5,4"/>')
        out.append(f'<text x="{x1}" y="{PLOT_TOP + 16 * i}" font-size="12" text-anchor="end" '
                   f'fill="{color}">{escape(name)}: max/mean {run["load_spread"]:.2f}'
                   f'{" (prefill pool)" if "pd" in run else ""}</text>')
    return out


def chart_svg(result: dict, title: str = "") -> str:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'font-family="sans-serif" viewBox="0 0 {WIDTH} {HEIGHT}">',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>']
    if title:
        parts.append(f'<text x="10" y="{HEIGHT - 8}" font-size="11" fill="#555">'
                     f'{escape(title)}</text>')
    parts += _cdf(result, 70, 520)
    parts += _bars(result, 580, 980)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
