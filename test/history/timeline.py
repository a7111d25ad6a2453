#!/usr/bin/python3
"""timeline.py RUN_DIR [--window FROM:TO] [--out FILE]: draw a history run
as a self-contained SVG (RUN_DIR/timeline.svg; no script, no network).

Top: one lane per worker.  A grey bar is a lock held (from the grant to the
release); on it, each write is a tick: green acknowledged, red rejected by
the fence (LF001/LF002/LF003), orange refused for another reason, black
unknown (the connection broke).  Faults are shaded bands across all lanes,
labelled at the top.  Bottom: one panel per lock service with the token of
every acknowledged write per resource over time (a line per resource) and
the rejected tokens as red crosses: a failover that regresses the tokens
shows as crosses below the line.
"""

import argparse
import html
import json
import os
import re

LANE, LEFT, WIDTH, PANEL = 20, 110, 1500, 110
OK, REJECTED, REFUSED, UNKNOWN = "#2a9d3a", "#d62828", "#f08c00", "#222222"
VIOLATION = "#e000e0"
FAULT_COLOURS = {"etcd-leader-kill": "#9b5de5", "etcd-member-stop": "#c77dff",
                 "etcd-member-cut": "#e0aaff", "redis-failover": "#ff6b6b",
                 "zk-session-expiry": "#4cc9f0", "worker-pause": "#ffd166",
                 "pg-crash": "#8d99ae"}
RESOURCE_COLOURS = ["#1d3557", "#e76f51", "#2a9d8f", "#8338ec", "#fb8500", "#6a994e", "#bc4749"]
WRITES = ("counter", "transfer", "append")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--window", help="FROM:TO seconds")
    ap.add_argument("--out")
    a = ap.parse_args()
    with open(os.path.join(a.run, "history.jsonl")) as f:
        events = [json.loads(line) for line in f]
    t_from, t_to = 0.0, max(e["time"] for e in events)
    if a.window:
        t_from, t_to = (float(x) for x in a.window.split(":"))
    # the operations the checker named in a violation, if it ran
    flagged = set()
    vfile = os.path.join(a.run, "violations.txt")
    if os.path.exists(vfile):
        with open(vfile) as f:
            flagged = set(re.findall(r"^    (\S+) \(", f.read(), re.M))
    out = a.out or os.path.join(a.run, "timeline.svg")
    with open(out, "w") as f:
        f.write(draw(events, t_from, t_to, flagged))
    print(f"history: timeline in {out}")


def draw(events, t_from, t_to, flagged):
    workers = sorted(e["process"] for e in events if e["process"] != "nemesis")
    workers = sorted(set(workers))      # etcd-1.., redis-1.., zk-1..
    services = sorted({w.split("-")[0] for w in workers})
    top = 58
    lanes_h = LANE * len(workers)
    height = top + lanes_h + 30 + (PANEL + 20) * len(services) + 40
    span = max(t_to - t_from, 1e-9)

    def x(t):
        return LEFT + (min(max(t, t_from), t_to) - t_from) / span * (WIDTH - LEFT - 20)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>']
    start = next((e for e in events if e["f"] == "start"), {"value": {}})["value"]
    mode = "fenced" if start.get("fenced", True) else "WITHOUT the fence (self-check)"
    svg.append(f'<text x="10" y="16" font-size="13" font-weight="bold">lockfence history, '
               f'{mode}, seed {start.get("seed")}, {t_from:.0f} to {t_to:.0f} s</text>')
    legend = [(OK, "acknowledged"), (REJECTED, "rejected by the fence"),
              (REFUSED, "refused (other error)"), (UNKNOWN, "unknown outcome"), ("#d9d9d9", "lock held"),
              (VIOLATION, "acknowledged, but named in a violation by the checker")]
    lx = 10
    for colour, label in legend:
        svg.append(f'<rect x="{lx}" y="24" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{lx + 14}" y="33">{label}</text>')
        lx += 24 + 7 * len(label)

    # fault bands
    open_faults = {}
    for e in events:
        if e["process"] != "nemesis" or e["f"] not in FAULT_COLOURS:
            continue
        if e["type"] == "invoke":
            open_faults[e["f"]] = e
        elif e["f"] in open_faults:
            s = open_faults.pop(e["f"])
            if e["time"] < t_from or s["time"] > t_to:
                continue
            x0, x1 = x(s["time"]), x(e["time"])
            title = html.escape(f'{e["f"]}: {s.get("value")}, {e.get("value")}')
            svg.append(f'<g><title>{title}</title><rect x="{x0:.1f}" y="{top - 8}" '
                       f'width="{max(x1 - x0, 2):.1f}" height="{lanes_h + 8}" '
                       f'fill="{FAULT_COLOURS[e["f"]]}" opacity="0.35"/>'
                       f'<text x="{x0:.1f}" y="{top - 11}" font-size="9">{e["f"]}</text></g>')

    # lanes: holds, then writes
    for i, w in enumerate(workers):
        y = top + i * LANE
        svg.append(f'<text x="10" y="{y + 14}">{w}</text>'
                   f'<line x1="{LEFT}" x2="{WIDTH - 20}" y1="{y + LANE}" y2="{y + LANE}" stroke="#eee"/>')
    lane = {w: top + i * LANE for i, w in enumerate(workers)}
    held, invoked, ticks, holds = {}, {}, [], []
    for e in events:
        p = e["process"]
        if p not in lane:
            continue
        if e["f"] == "lock" and e["type"] == "ok":
            held[p] = e["time"]
        elif e["f"] == "unlock" and e["type"] != "invoke" and p in held:
            t0 = held.pop(p)
            if e["time"] >= t_from and t0 <= t_to:
                holds.append((lane[p], x(t0), max(x(e["time"]), x(t0) + 1)))
        elif e["f"] in WRITES:
            if e["type"] == "invoke":
                invoked[e["op"]] = e["time"]
                continue
            t0 = invoked.pop(e["op"], e["time"])
            if e["time"] < t_from or t0 > t_to:
                continue
            err = (e.get("error") or "")[:5]
            colour = (OK if e["type"] == "ok" else UNKNOWN if e["type"] == "info" else
                      REJECTED if err in ("LF001", "LF002", "LF003") else REFUSED)
            if e["type"] == "ok" and e["op"] in flagged:
                colour = VIOLATION
            ticks.append(([OK, VIOLATION].index(colour) if colour in (OK, VIOLATION) else 1,
                          lane[p], colour, x(t0), max(x(e["time"]), x(t0) + 1.2)))
    svg += bars(merge([(0, y + 4, "#d9d9d9", x0, x1) for y, x0, x1 in holds]), LANE - 8)
    # Ticks closer than a pixel merge into one bar, so that a long run stays
    # a small file; failures and violations are drawn on top of the green.
    svg += bars(merge([(o, y + 2, c, x0, x1) for o, y, c, x0, x1 in ticks]), LANE - 4)

    # token panels
    y0 = top + lanes_h + 30
    for service in services:
        svg.append(panel(events, service, y0, x, t_from, t_to, flagged))
        y0 += PANEL + 20
    svg.append(f'<text x="{LEFT}" y="{height - 12}">time (s): {t_from:.0f}'
               f'<tspan x="{WIDTH - 60}">{t_to:.0f}</tspan></text>')
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


def merge(bars):
    """Merge bars (order, y, colour, x0, x1) of one lane and colour that
    overlap or lie within 1.5 pixels of each other."""
    merged = []
    for bar in sorted(bars):
        last = merged[-1] if merged else None
        if last and last[:3] == list(bar[:3]) and bar[3] <= last[4] + 1.5:
            last[4] = max(last[4], bar[4])
        else:
            merged.append(list(bar))
    return merged


def bars(merged, height):
    """One SVG path per lane and colour, in the order given (later on top)."""
    paths = {}
    for order, y, colour, x0, x1 in merged:
        paths.setdefault((order, y, colour), []).append(
            f"M{x0:.1f} {y}h{x1 - x0:.1f}v{height}h-{x1 - x0:.1f}z")
    return [f'<path fill="{colour}" d="{"".join(d)}"/>'
            for (_, _, colour), d in sorted(paths.items())]


def thin(pts):
    """Drop the points of a line that fall on the same pixel as the last kept."""
    out = []
    for p in pts:
        if not out or p != out[-1]:
            out.append(p)
    return out


def panel(events, service, y0, x, t_from, t_to, flagged):
    """Tokens per resource of one service: acknowledged as lines, rejected as
    crosses, acknowledged writes named in a violation as circles."""
    points, rejected, bad = {}, [], []
    for e in events:
        if (e["f"] not in WRITES or e["type"] not in ("ok", "fail") or "token" not in e
                or not e["process"].startswith(service + "-") or not t_from <= e["time"] <= t_to):
            continue
        for res, tok in zip(e["resource"], e["token"]):
            if e["type"] == "ok":
                points.setdefault(res, []).append((e["time"], tok))
                if e["op"] in flagged:
                    bad.append((e["time"], tok))
            elif (e.get("error") or "")[:5] in ("LF001", "LF002", "LF003"):
                rejected.append((e["time"], tok))
    out = [f'<text x="10" y="{y0 + 12}" font-weight="bold">{service} tokens</text>',
           f'<rect x="{LEFT}" y="{y0}" width="{WIDTH - LEFT - 20}" height="{PANEL}" '
           f'fill="none" stroke="#ccc"/>']
    toks = [t for pts in points.values() for _, t in pts] + [t for _, t in rejected]
    if not toks:
        return "\n".join(out)
    lo, hi = min(toks), max(toks)

    def y(tok):
        return y0 + PANEL - 4 - (tok - lo) / max(hi - lo, 1) * (PANEL - 8)
    out.append(f'<text x="10" y="{y0 + 26}" font-size="9">{hi}</text>'
               f'<text x="10" y="{y0 + PANEL}" font-size="9">{lo}</text>')
    for i, (res, pts) in enumerate(sorted(points.items())):
        colour = RESOURCE_COLOURS[i % len(RESOURCE_COLOURS)]
        path = " ".join(f"{px},{py}" for px, py in thin([(2 * round(x(t) / 2), round(y(tok)))
                                                           for t, tok in pts]))
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.2">'
                   f'<title>{html.escape(res)}</title></polyline>')
        out.append(f'<text x="{10 + 0}" y="{y0 + 40 + 10 * i}" font-size="9" fill="{colour}">{html.escape(res.split("/", 1)[1])}</text>')
    for t, tok in rejected:
        out.append(f'<path d="M{x(t) - 3:.0f},{y(tok) - 3:.0f}l6,6m0,-6l-6,6" stroke="{REJECTED}" stroke-width="1.5"/>')
    for t, tok in bad:
        out.append(f'<circle cx="{x(t):.0f}" cy="{y(tok):.0f}" r="3.5" fill="none" stroke="{VIOLATION}" stroke-width="1.5"/>')
    return "\n".join(out)


if __name__ == "__main__":
    main()
