"""The Grafana dashboard's panels drawn without Grafana: every query of
deploy/grafana/nightshift-dashboard.json run against a Prometheus over a time range
(``/api/v1/query_range``), each panel drawn with matplotlib into one PNG.

The queries are read out of the dashboard JSON, so the tests that check them, this renderer
and Grafana all run the same ones. docs/monitoring.md shows a PNG drawn by this module.

    python -m deploy.render_dashboard --prometheus http://127.0.0.1:9090 --hours 12 \\
        --out dashboard.png
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).parent / "grafana" / "nightshift-dashboard.json"
# What Grafana's "All" puts in a regex matcher.
ALL = ".*"
COLUMNS = 2
UNIT_LABELS = {"percentunit": "share", "s": "seconds", "currencyUSD": "USD", "short": ""}


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel: the panel's title and unit, the PromQL as the dashboard holds
    it (with Grafana's ``$variables``), and the legend template (``{{label}}``)."""

    panel: str
    unit: str
    expr: str
    legend: str


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def panels(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    """The dashboard's panels in reading order (rows, then columns)."""
    found = load(path)["panels"]
    return sorted(found, key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))


def queries(path: Path = DASHBOARD) -> list[PanelQuery]:
    """Every panel's queries, as the dashboard holds them."""
    return [
        PanelQuery(p["title"], p["fieldConfig"]["defaults"].get("unit", ""), t["expr"],
                   t.get("legendFormat", ""))
        for p in panels(path)
        for t in p["targets"]
    ]  # fmt: skip


def variables(path: Path = DASHBOARD) -> list[str]:
    """The names of the dashboard's template variables (``asset``, ``partition``)."""
    return [v["name"] for v in load(path)["templating"]["list"]]


def expand(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with each ``$name`` replaced by its value (a regex: every matcher of a
    variable is ``=~``); a variable without a value fails, naming it."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(f"query {expr!r}: no value for the dashboard variable ${name}")
        return values[name]

    return re.sub(r"\$(\w+)", value, expr)


def query_range(base: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    """The series of a range query (``{"metric": labels, "values": [[t, "v"], ...]}``); a
    query Prometheus refuses fails with its error and the query."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    try:
        with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=30) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read())
    if answer.get("status") != "success":
        raise ValueError(f"{base}: query {expr!r} failed: {answer.get('error')}")
    return answer["data"]["result"]


def legend(template: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def threshold(panel: Mapping[str, Any]) -> float | None:
    """The panel's drawn threshold (a dashed line in Grafana), if it has one."""
    defaults = panel["fieldConfig"]["defaults"]
    if defaults.get("custom", {}).get("thresholdsStyle", {}).get("mode", "off") == "off":
        return None
    steps = [s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None]
    return steps[0] if steps else None


def render(
    base: str,
    start: float,
    end: float,
    out: Path,
    values: Mapping[str, str] | None = None,
    path: Path = DASHBOARD,
) -> dict[str, int]:
    """Draws every panel of the dashboard at ``path`` from the Prometheus at ``base`` over
    ``start``..``end`` (epoch seconds) into the PNG ``out``.

    Args:
        values: the template variables' values (regexes); each one missing is All.

    Returns:
        Each panel's title and how many series it drew.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    chosen = {name: ALL for name in variables(path)} | dict(values or {})
    step = max((end - start) / 400, 1.0)
    shown = panels(path)
    rows = math.ceil(len(shown) / COLUMNS)
    figure, axes = plt.subplots(rows, COLUMNS, figsize=(7 * COLUMNS, 3.2 * rows), squeeze=False)
    drawn: dict[str, int] = {}
    for panel, ax in zip(shown, axes.flat, strict=False):
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        count = 0
        for target in panel["targets"]:
            for series in query_range(base, expand(target["expr"], chosen), start, end, step):
                points = [(float(t), float(v)) for t, v in series["values"]]
                when = [dt.datetime.fromtimestamp(t, dt.UTC) for t, _ in points]
                ax.plot(when, [v for _, v in points],
                        label=legend(target.get("legendFormat", ""), series["metric"]))  # fmt: skip
                count += 1
        line = threshold(panel)
        if line is not None:
            ax.axhline(line, color="red", linestyle="--", linewidth=1)
        if unit == "percentunit":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylabel(UNIT_LABELS.get(unit, unit))
        ax.set_title(panel["title"], fontsize=10)
        # Every panel spans the whole range, as Grafana's panels share the dashboard's.
        ax.set_xlim(
            dt.datetime.fromtimestamp(start, dt.UTC), dt.datetime.fromtimestamp(end, dt.UTC)
        )
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=dt.UTC, maxticks=6))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=dt.UTC))
        ax.grid(alpha=0.3)
        if count:
            ax.legend(fontsize=6, loc="best", ncol=2 if count > 4 else 1)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        drawn[panel["title"]] = count
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    title = load(path)["title"]
    figure.suptitle(f"{title} (UTC)", fontsize=12)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return drawn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--hours", type=float, default=12.0, help="the range: the last N hours")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--asset", default=ALL, help="regex of the assets shown")
    parser.add_argument("--partition", default=ALL, help="regex of the partitions shown")
    args = parser.parse_args(argv)
    end = time.time()
    drawn = render(args.prometheus, end - args.hours * 3600, end, args.out,
                   {"asset": args.asset, "partition": args.partition})  # fmt: skip
    for title, count in drawn.items():
        print(f"{title}: {count} series")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
