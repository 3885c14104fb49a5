#!/usr/bin/env python3
"""Draws the charts of BENCHMARKS.md from the markdown that `examples/compare` prints.

Usage: python3 benches/compare/charts.py compare-output.md docs/charts/
No third-party packages: the charts are plain SVG.
"""

import html
import os
import re
import sys

COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d"]


def parse_tables(text):
    """Returns {title: (header, rows)} with each row as (label, [median or None, ...])."""
    tables = {}
    title = None
    for block in re.split(r"\n(?=### )", text):
        lines = block.strip().splitlines()
        if not lines or not lines[0].startswith("### "):
            continue
        title = lines[0][4:].split(" (")[0]
        table = [l for l in lines if l.startswith("|")]
        if len(table) < 3:
            continue
        header = [c.strip() for c in table[0].strip("|").split("|")]
        rows = []
        for line in table[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            values = []
            for cell in cells[1:]:
                match = re.match(r"([0-9.]+)", cell)
                values.append(float(match.group(1)) if match and "×" not in cell else None)
            rows.append((cells[0], values))
        tables[title] = (header, rows)
    return tables


def bar_chart(path, title, unit, groups, series, values, log=False):
    """Grouped bars: `values[g][s]` for each group g and series s (None is skipped)."""
    width, height, left, bottom, top = 860, 420, 70, 90, 50
    # Legend: four names a row, or two if a name is long; the canvas grows with its rows.
    columns = 4 if max(len(name) for name in series) <= 26 else 2
    extra = max(0, -(-len(series) // columns) - 2) * 16
    height, bottom = height + extra, bottom + extra
    plot_w, plot_h = width - left - 20, height - top - bottom
    top_value = max(v for row in values for v in row if v is not None) * 1.15
    bar_w = plot_w / len(groups) / (len(series) + 1)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{html.escape(title)}</text>',
        f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" text-anchor="middle">{html.escape(unit)}</text>',
    ]
    for i in range(5):
        value = top_value * i / 4
        y = top + plot_h - plot_h * i / 4
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{value:.0f}</text>')
    for g, group in enumerate(groups):
        x0 = left + g * plot_w / len(groups) + bar_w / 2
        for s, _ in enumerate(series):
            value = values[g][s]
            if value is None:
                continue
            h = plot_h * value / top_value
            x = x0 + s * bar_w
            out.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w * 0.9:.1f}" height="{h:.1f}" fill="{COLORS[s % len(COLORS)]}"/>')
            out.append(f'<text x="{x + bar_w * 0.45:.1f}" y="{top + plot_h - h - 3:.1f}" text-anchor="middle" font-size="10">{value:.0f}</text>')
        out.append(f'<text x="{x0 + len(series) * bar_w / 2:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{html.escape(group)}</text>')
    for s, name in enumerate(series):
        x = left + (s % columns) * (800 // columns)
        y = height - 40 - extra + (s // columns) * 16
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{COLORS[s % len(COLORS)]}"/>')
        out.append(f'<text x="{x + 16}" y="{y}">{html.escape(name)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def chart_table(tables, name, path, title, unit, row_filter=lambda label: True):
    header, rows = tables[name]
    # Data columns only: ratio columns read "X vs best peer" or "X vs <reference peer>".
    series = [h for h in header[1:] if " vs " not in h]
    rows = [(label, values[: len(series)]) for label, values in rows if row_filter(label)]
    bar_chart(path, title, unit, [label for label, _ in rows], series, [values for _, values in rows])


def main():
    source, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    tables = parse_tables(open(source).read())
    find = lambda prefix: next(t for t in tables if t.startswith(prefix))
    chart_table(tables, find("Schedule"), f"{out_dir}/schedule.svg", "Register a timer (lower is better)", "ns per timer")
    chart_table(tables, find("Cancel"), f"{out_dir}/cancel.svg", "Cancel a timer (lower is better)", "ns per timer")
    if any(t.startswith("Schedule + cancel pair") for t in tables):  # not in older outputs
        chart_table(tables, find("Schedule + cancel pair"), f"{out_dir}/schedule_cancel_pair.svg", "Register + cancel a timer (lower is better)", "ns per pair")
    chart_table(tables, find("Postpone"), f"{out_dir}/postpone.svg", "Move a timer (lower is better)", "ns per move")
    chart_table(tables, find("Keyed churn"), f"{out_dir}/keyed_churn.svg", "Keyed churn (lower is better)", "ns per op")
    chart_table(tables, find("Many producers"), f"{out_dir}/producers.svg", "Register + cancel from P tasks (lower is better)", "ns per pair")
    chart_table(tables, find("Fire: lateness"), f"{out_dir}/lateness.svg", "Lateness while firing n timers over 1 s (lower is better)", "µs")
    chart_table(tables, find("Memory"), f"{out_dir}/memory.svg", "Heap bytes per pending timer (lower is better)", "bytes")
    print(f"wrote charts to {out_dir}")


if __name__ == "__main__":
    main()
