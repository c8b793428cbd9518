"""The evaluation's tables: one Markdown layout for every data set's metrics."""

from __future__ import annotations


def metric_table(rows: list[dict], count: str, digits: int) -> str:
    """Evaluation rows (dataset, method, metric, value, ``count``) as a Markdown table: one line
    per dataset and method, one column per metric, values to ``digits`` places."""
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    values = {(r["dataset"], r["method"], r["metric"]): r for r in rows}
    lines = [
        f"| dataset | method | {' | '.join(metrics)} | {count} |",
        "|---|---|" + "---|" * (len(metrics) + 1),
    ]
    for dataset, method in dict.fromkeys((r["dataset"], r["method"]) for r in rows):
        found = [values.get((dataset, method, m)) for m in metrics]
        cells = [f"{r['value']:.{digits}f}" if r else "" for r in found]
        n = next((r[count] for r in found if r), 0)
        lines.append(f"| {dataset} | {method} | {' | '.join(cells)} | {n} |")
    return "\n".join(lines)
