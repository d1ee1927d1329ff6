"""One consistent picture of the pool, assembled from every source, plus the reward-curve SVG."""

from __future__ import annotations

import time

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


def reward_svg(points: list[tuple[int, float]], width: int = 640, height: int = 220) -> str:
    """A plain inline SVG line chart (no JS library, no build step): step on x, reward on y."""
    if not points:
        return ""
    pad = 36
    steps = [p[0] for p in points]
    rewards = [p[1] for p in points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(0.0, min(rewards)), max(1.0, max(rewards))
    sx = (width - 2 * pad) / max(1, x1 - x0)
    sy = (height - 2 * pad) / ((y1 - y0) or 1.0)

    def xy(step: int, reward: float) -> str:
        return f"{pad + (step - x0) * sx:.1f},{height - pad - (reward - y0) * sy:.1f}"

    line = " ".join(xy(s, r) for s, r in points)
    dots = ""
    for s, r in points:
        cx, cy = xy(s, r).split(",")
        dots += f'<circle cx="{cx}" cy="{cy}" r="2.5"><title>step {s}: {r:.3f}</title></circle>'

    return (
        f'<svg id="reward-plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="mean task reward per step">'
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" class="axis"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" class="axis"/>'
        f'<text x="{pad}" y="{height - 8}">step {x0}</text>'
        f'<text x="{width - pad}" y="{height - 8}" text-anchor="end">step {x1}</text>'
        f'<text x="4" y="{pad}">{y1:.2f}</text><text x="4" y="{height - pad}">{y0:.2f}</text>'
        f'<polyline points="{line}" class="curve"/>{dots}</svg>'
    )
