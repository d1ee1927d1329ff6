"""One consistent picture of the pool, assembled from every source, plus the reward-curve SVG."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from dashboard.sources import ChainSource, Section, Source

PANELS = ("nodes", "tasks", "groups", "verdicts", "rewards", "payouts")


class Snapshot(BaseModel):
    pool_id: int
    taken_at: float = Field(default_factory=time.time)
    panels: dict[str, Section]

    def counts(self, panel: str, key: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.panels[panel].rows:
            value = str(row.get(key))
            out[value] = out.get(value, 0) + 1
        return dict(sorted(out.items()))


def take(sources: list[Source], pool_id: int) -> Snapshot:
    panels: dict[str, Section] = {p: Section(error="no source configured") for p in PANELS}
    chain: ChainSource | None = None
    for source in sources:
        if isinstance(source, ChainSource):
            chain = source  # last: it also reports nodes the orchestrator knows but the pool dropped
            continue
        panels.update(source.read())
    if chain is not None:
        chain.known = {str(r["address"]) for r in panels["nodes"].rows} | {
            str(r["node"]) for r in panels["verdicts"].rows if r.get("node")
        }
        panels.update(chain.read())
    return Snapshot(pool_id=pool_id, panels=panels)


def hold_last_good(snap: Snapshot, memory: dict[str, Section]) -> Snapshot:
    """A source that stops answering keeps what it last showed: its panel holds those rows with a quiet
    "offline since" note, never an error in place of data that exists (after a run, the trainer and
    the validators exit, and the page is looked at exactly then). `memory`: each panel's last good
    section, updated here."""
    for name, section in snap.panels.items():
        last = memory.get(name)
        if section.error is None:
            memory[name] = section
        elif last is not None and last.rows:
            since = last.offline_since or time.time()
            when = datetime.fromtimestamp(since, UTC).strftime("%H:%M:%S UTC")
            snap.panels[name] = last.model_copy(update={
                "error": None, "offline_since": since,
                "note": f"offline since {when} ({section.error}); showing what it last held",
            })  # fmt: skip
            memory[name] = snap.panels[name]
    return snap


def reward_svg(points: list[tuple[int, float]], width: int = 640, height: int = 240) -> str:
    """A plain inline SVG line chart (no JS library, no build step): trainer step on x, mean task
    reward on y, with ticks and axis titles; it scales to the page's width (viewBox)."""
    if not points:
        return ""
    left, right, top, bottom = 48, 16, 12, 40
    steps = [p[0] for p in points]
    rewards = [p[1] for p in points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(0.0, min(rewards)), max(1.0, max(rewards))
    sx = (width - left - right) / max(1, x1 - x0)
    sy = (height - top - bottom) / ((y1 - y0) or 1.0)

    def x_of(step: float) -> float:
        return left + (step - x0) * sx

    def y_of(reward: float) -> float:
        return height - bottom - (reward - y0) * sy

    parts = [
        f'<svg id="reward-plot" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="mean task reward per trainer step">',
        f'<line x1="{left}" y1="{y_of(y0):.1f}" x2="{width - right}" y2="{y_of(y0):.1f}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y_of(y0):.1f}" class="axis"/>',
    ]
    for i in range(5):  # y ticks: quarters of the range, with a faint grid line
        value = y0 + (y1 - y0) * i / 4
        y = y_of(value)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.2f}</text>')
    span = x1 - x0
    ticks = range(x0, x1 + 1) if span <= 8 else sorted({x0 + span * i // 4 for i in range(5)})
    for step in ticks:
        x = x_of(step)
        parts.append(f'<text x="{x:.1f}" y="{height - bottom + 16}" text-anchor="middle">{step}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.1f}" y="{height - 6}" text-anchor="middle" '
                 f'class="title">trainer step</text>')
    parts.append(f'<text x="12" y="{(top + height - bottom) / 2:.1f}" text-anchor="middle" class="title" '
                 f'transform="rotate(-90 12 {(top + height - bottom) / 2:.1f})">mean task reward</text>')
    line = " ".join(f"{x_of(s):.1f},{y_of(r):.1f}" for s, r in points)
    parts.append(f'<polyline points="{line}" class="curve"/>')
    for s, r in points:
        parts.append(f'<circle cx="{x_of(s):.1f}" cy="{y_of(r):.1f}" r="2.5"><title>step {s}: {r:.3f}</title>'
                     "</circle>")
    parts.append("</svg>")
    return "".join(parts)
