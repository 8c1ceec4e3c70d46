"""Static SVG drawings of response trees: layout, colours, pair marks, hover titles.

A drawing shows one datapoint's tree for one agent: every node is filled by that agent's expected
reward (one colour scale per agent over the whole iteration, so trees compare), the agent's chosen
and rejected children are outlined green (solid) and red (dashed) with a check or cross on the
edge from their parent, and a node's SVG <title> shows its messages when hovered. No JavaScript.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from nip_core.episode import DECISION_NAMES

CHOSEN = "#1a9641"
REJECTED = "#d7191c"
COLOUR_MAP = "viridis"
NODE_RADIUS = 10
LEVEL_HEIGHT = 70
SMALL_WIDTH = 560  # two drawings side by side
WIDE_WIDTH = 1240  # one drawing per row
MARGIN_LEFT = 70
MARGIN = 24
HALO = 'stroke="#fff" stroke-width="3" paint-order="stroke"'


@dataclass(frozen=True)
class NodePosition:
    x: float
    depth: int


def children_of(node_ids: Sequence[str], parent_ids: Sequence[str | None]) -> dict[str, list[str]]:
    """parent id -> child ids in tree order (by child index, which ends every node id)."""
    children: dict[str, list[str]] = {nid: [] for nid in node_ids}
    for nid, parent in zip(node_ids, parent_ids, strict=True):
        if parent is not None and parent in children:
            children[parent].append(nid)
    for kids in children.values():
        kids.sort(key=lambda nid: int(nid.rsplit(".", 1)[-1]))
    return children


def tree_layout(
    node_ids: Sequence[str], parent_ids: Sequence[str | None], spacing: float
) -> dict[str, NodePosition]:
    """Leaves side by side in depth-first order, each parent centred over its children."""
    children = children_of(node_ids, parent_ids)
    roots = [nid for nid, p in zip(node_ids, parent_ids, strict=True) if p not in children]
    positions: dict[str, NodePosition] = {}
    next_leaf = 0.0

    def place(nid: str, depth: int) -> float:
        nonlocal next_leaf
        kids = children[nid]
        if not kids:
            x = next_leaf
            next_leaf += spacing
        else:
            xs = [place(kid, depth + 1) for kid in kids]
            x = (xs[0] + xs[-1]) / 2
        positions[nid] = NodePosition(x, depth)
        return x

    for root in roots:
        place(root, 0)
    return positions


def colour_scale(values: Sequence[float], vmin: float, vmax: float) -> list[str]:
    """Hex colours of `values` on the colour map, clipped to [vmin, vmax]."""
    import matplotlib
    from matplotlib.colors import to_hex

    cmap = matplotlib.colormaps[COLOUR_MAP]
    span = (vmax - vmin) or 1.0
    return [to_hex(cmap(min(max((v - vmin) / span, 0.0), 1.0))) for v in values]


def text_colour(fill: str) -> str:
    """Black or white, whichever reads better on `fill`."""
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#fff"


def pair_roles(pairs: pd.DataFrame, agent: str) -> dict[str, str]:
    """node id -> "chosen"/"rejected" for the agent's pairs (one role per node and agent)."""
    if pairs is None or pairs.empty:
        return {}
    mine = pairs[pairs["agent"] == agent]
    roles = dict.fromkeys(mine["chosen_node_id"], "chosen")
    roles.update(dict.fromkeys(mine["rejected_node_id"], "rejected"))
    return roles


def node_text(row: Mapping) -> str:
    """What a node says: its channel messages, or the raw text of an agent that only decided."""
    parts = [f"{m['agent']} [{m['channel']}]: {m['content']}" for m in row["messages"]]
    senders = {m["agent"] for m in row["messages"]}
    parts += [
        f"{m['agent']}: {m['content']}" for m in row["raw_messages"] if m["agent"] not in senders
    ]
    failure = row.get("failure")
    if isinstance(failure, str) and failure:
        parts.append(f"failure: {failure}")
    return "\n".join(parts)


def node_verdict(row: Mapping) -> str | None:
    """The node's verdict: "accept", "reject", "terminated" (ended without one) or None."""
    decision = row.get("decision")
    if decision is not None and not pd.isna(decision):
        return DECISION_NAMES[int(decision)]
    return "terminated" if row.get("terminated") else None


def verdict_mark(row: Mapping) -> str:
    """The one-letter badge drawn in a node: A(ccept), R(eject), T(erminated) or nothing."""
    return (node_verdict(row) or "")[:1].upper()


def _label_rotated(positions: Mapping[str, NodePosition], labels: Mapping[str, str]) -> set[int]:
    """Depths whose labels would collide horizontally, so they are drawn vertically."""
    by_depth: dict[int, list[float]] = {}
    for pos in positions.values():
        by_depth.setdefault(pos.depth, []).append(pos.x)
    longest = max((len(t) for t in labels.values()), default=0) * 6.2
    rotated = set()
    for depth, xs in by_depth.items():
        xs.sort()
        gaps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
        if gaps and min(gaps) < longest + 4:
            rotated.add(depth)
    return rotated


def colour_bar_svg(
    uid: str, x: float, y: float, width: float, vmin: float, vmax: float, label: str
) -> str:
    stops = colour_scale([vmin + (vmax - vmin) * i / 10 for i in range(11)], vmin, vmax)
    gradient = "".join(f'<stop offset="{i * 10}%" stop-color="{c}"/>' for i, c in enumerate(stops))
    return (
        f'<defs><linearGradient id="{uid}-cb">{gradient}</linearGradient></defs>'
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="12" fill="url(#{uid}-cb)" '
        'stroke="#555" stroke-width="0.5"/>'
        f'<text x="{x:.1f}" y="{y + 26:.1f}" font-size="11">{vmin:.2f}</text>'
        f'<text x="{x + width:.1f}" y="{y + 26:.1f}" font-size="11" text-anchor="end">{vmax:.2f}</text>'
        f'<text x="{x + width / 2:.1f}" y="{y + 26:.1f}" font-size="11" text-anchor="middle">'
        f"{html.escape(label)}</text>"
    )


def _legend_svg(x: float, y: float) -> str:
    return (
        f'<g font-size="11" transform="translate({x:.1f},{y:.1f})">'
        f'<circle cx="6" cy="0" r="6" fill="#ddd" stroke="{CHOSEN}" stroke-width="3"/>'
        '<text x="16" y="4">chosen</text>'
        f'<circle cx="80" cy="0" r="6" fill="#ddd" stroke="{REJECTED}" stroke-width="3" '
        'stroke-dasharray="3,2"/><text x="90" y="4">rejected</text>'
        '<text x="160" y="4">A/R = verdict accept/reject, T = terminated</text></g>'
    )


@dataclass(frozen=True)
class Geometry:
    """Sizes that shrink with the number of leaves, so wide trees stay readable."""

    spacing: float
    radius: float

    @classmethod
    def for_leaves(cls, leaves: int) -> Geometry:
        room = SMALL_WIDTH if leaves * 22 <= SMALL_WIDTH else WIDE_WIDTH
        spacing = max(3.0, min(48.0, room / max(leaves, 1)))
        return cls(spacing=spacing, radius=max(2.0, min(NODE_RADIUS, 0.42 * spacing)))

    @property
    def labels(self) -> bool:
        return self.spacing >= 14

    @property
    def badges(self) -> bool:
        return self.radius >= 7

    @property
    def outline(self) -> float:
        return max(1.5, 0.4 * self.radius)


def _edge_svg(
    start: tuple[float, float], end: tuple[float, float], role: str | None, g: Geometry
) -> str:
    (x1, y1), (x2, y2) = start, end
    style = 'stroke="#999" stroke-width="1.2"'
    if role == "chosen":
        style = f'stroke="{CHOSEN}" stroke-width="{g.outline:.1f}"'
    elif role == "rejected":
        style = f'stroke="{REJECTED}" stroke-width="{g.outline:.1f}" stroke-dasharray="6,3"'
    svg = f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" {style}/>'
    if role and g.radius >= 6:
        mark, colour = ("\u2713", CHOSEN) if role == "chosen" else ("\u2717", REJECTED)
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2
        svg += (
            f'<circle cx="{mx:.1f}" cy="{my:.1f}" r="7" fill="#fff" stroke="{colour}"/>'
            f'<text x="{mx:.1f}" y="{my + 4:.1f}" font-size="11" font-weight="bold" '
            f'text-anchor="middle" fill="{colour}">{mark}</text>'
        )
    return svg


def _node_svg(
    row: Mapping,
    at: tuple[float, float],
    fill: str,
    value: float | None,
    role: str | None,
    agent: str,
    g: Geometry,
) -> str:
    """A node circle with its hover title (id, value, role, messages) and verdict badge."""
    x, y = at
    stroke = 'stroke="#333" stroke-width="1"'
    if role == "chosen":
        stroke = f'stroke="{CHOSEN}" stroke-width="{g.outline:.1f}"'
    elif role == "rejected":
        stroke = f'stroke="{REJECTED}" stroke-width="{g.outline:.1f}" stroke-dasharray="4,2"'
    title = f"{row['node_id']} (round {row['round']})\n{agent} expected reward: "
    title += "n/a" if value is None else f"{value:.3f}"
    title += f"\n{role}" if role else ""
    text = node_text(row)
    title += f"\n\n{text}" if text else ""
    svg = (
        f"<g><title>{html.escape(title)}</title>"
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{g.radius:.1f}" fill="{fill}" {stroke}/>'
    )
    mark = verdict_mark(row)
    if mark and g.badges:
        svg += (
            f'<text x="{x:.1f}" y="{y + 4:.1f}" font-size="11" font-weight="bold" '
            f'text-anchor="middle" fill="{text_colour(fill)}">{mark}</text>'
        )
    return svg + "</g>"


def _label_svg(node_id: str, at: tuple[float, float], rotated: bool, g: Geometry) -> str:
    x, y = at[0], at[1] + g.radius + 12
    if rotated:
        return (
            f'<text x="{x + 4:.1f}" y="{y - 2:.1f}" font-size="10" fill="#333" {HALO} '
            f'transform="rotate(90 {x + 4:.1f} {y - 2:.1f})">{html.escape(node_id)}</text>'
        )
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="10" fill="#333" {HALO} '
        f'text-anchor="middle">{html.escape(node_id)}</text>'
    )


def tree_svg(
    tree_nodes: pd.DataFrame,
    expected: Mapping[str, float],
    roles: Mapping[str, str],
    agent: str,
    value_range: tuple[float, float],
    uid: str,
) -> str:
    """The SVG of one tree for one agent.

    `tree_nodes` are the nodes rows of one datapoint, `expected` maps node id -> this agent's
    expected reward, `roles` node id -> "chosen"/"rejected", `uid` keeps element ids unique when
    several drawings share a page.
    """
    node_ids = tree_nodes["node_id"].tolist()
    parent_ids = [None if pd.isna(p) else p for p in tree_nodes["parent_id"]]
    leaves = sum(1 for kids in children_of(node_ids, parent_ids).values() if not kids)
    g = Geometry.for_leaves(leaves)
    positions = tree_layout(node_ids, parent_ids, g.spacing)
    depth = max(p.depth for p in positions.values())
    rotated = _label_rotated(positions, {nid: nid for nid in node_ids})
    label_room = 24
    if g.labels and depth in rotated:
        label_room = 6.2 * max(len(n) for n in node_ids) + 8
    width = max(MARGIN_LEFT + (leaves - 1) * g.spacing + MARGIN + g.radius, 520)
    plot_bottom = MARGIN + depth * LEVEL_HEIGHT + g.radius + label_room
    height = plot_bottom + 80
    xy = {nid: (MARGIN_LEFT + p.x, MARGIN + p.depth * LEVEL_HEIGHT) for nid, p in positions.items()}
    vmin, vmax = value_range
    colours = colour_scale([expected.get(n, vmin) for n in node_ids], vmin, vmax)
    fills = dict(zip(node_ids, colours, strict=True))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" role="img" '
        f'aria-label="response tree {html.escape(uid)} coloured by {html.escape(agent)}">'
    ]
    for d in range(depth + 1):
        name = "root" if d == 0 else f"round {d - 1}"
        y = MARGIN + d * LEVEL_HEIGHT + 4
        parts.append(f'<text x="4" y="{y}" font-size="11" fill="#666">{name}</text>')
    for nid, parent in zip(node_ids, parent_ids, strict=True):
        if parent is not None and parent in xy:
            parts.append(_edge_svg(xy[parent], xy[nid], roles.get(nid), g))
    for row in tree_nodes.to_dict("records"):
        nid = row["node_id"]
        parts.append(
            _node_svg(row, xy[nid], fills[nid], expected.get(nid), roles.get(nid), agent, g)
        )
        if g.labels:
            parts.append(_label_svg(nid, xy[nid], positions[nid].depth in rotated, g))
    bar_width = min(260.0, width - 2 * MARGIN)
    label = f"expected reward ({agent})"
    parts.append(colour_bar_svg(uid, MARGIN, plot_bottom + 6, bar_width, vmin, vmax, label))
    parts.append(_legend_svg(MARGIN, plot_bottom + 58))
    parts.append("</svg>")
    return "".join(parts)
