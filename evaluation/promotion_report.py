"""The tables of evaluation/promotion.py: the gate's figures per scenario, the retrain
noise, and the gate's rule replayed over those figures with other tolerances."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from assets.fraud.pipeline import FRAUD_GATE

METRICS = FRAUD_GATE.metrics
SAME = "same history, another seed"


def version_figures(trials: Sequence[dict]) -> list[dict[str, float]]:
    """Each version's figures on the held-out days: the champion's, then every same-history
    challenger's, as the gate measured them."""
    noise = [t for t in trials if t["scenario"] == SAME]
    champion = {k: noise[0]["gate"][f"champion_{k}"] for k in METRICS}
    return [champion, *({k: t["gate"][f"challenger_{k}"] for k in METRICS} for t in noise)]


def noise_summary(trials: Sequence[dict], tolerances: dict[str, float]) -> dict:
    """The retrain noise: the margins of equally good versions, and how often today's
    tolerances block one, over the gate's own verdicts (challenger seeds against the seed-0
    champion) and over every ordered pair of those versions by the gate's rule."""
    figures = version_figures(trials)
    pairs = list(itertools.permutations(range(len(figures)), 2))
    margins = {k: np.array([figures[j][k] - figures[i][k] for i, j in pairs]) for k in METRICS}
    blocked = [any(margins[k][n] < -tolerances[k] for k in METRICS) for n in range(len(pairs))]
    direct = [t for t in trials if t["scenario"] == SAME]
    out: dict = {
        "versions": len(figures),
        "ordered_pairs": len(pairs),
        "gate_false_blocks": sum(not t["passed"] for t in direct),
        "gate_verdicts": len(direct),
        "pair_false_block_rate": float(np.mean(blocked)),
    }
    for k in METRICS:
        values = np.array([f[k] for f in figures])
        out[k] = {
            "mean": float(values.mean()),
            "sd": float(values.std(ddof=1)),
            "margin_sd": float(values.std(ddof=1) * np.sqrt(2)),
            "worst_margin": float(margins[k].min()),
            "pair_block_rate": float(np.mean(margins[k] < -tolerances[k])),
            "tolerance_for_5pct": float(np.quantile(-margins[k], 0.95)),
        }
    return out


def _span(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:+.3f}" if lo == hi else f"{lo:+.3f} .. {hi:+.3f}"


def scenario_table(trials: Sequence[dict]) -> str:
    """One line per scenario: the gate's figures over its retrains, and how many it blocked."""
    lines = [
        "| scenario | retrains | training days | challenger AUPRC | champion AUPRC "
        "| margin AUPRC | margin recall at the champion's alerts | blocked |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario in dict.fromkeys(t["scenario"] for t in trials):
        group = [t for t in trials if t["scenario"] == scenario]
        gate = [t["gate"] for t in group]
        ours = [g["challenger_auprc"] for g in gate]
        theirs = sorted({g["champion_auprc"] for g in gate})
        lines.append(
            f"| {scenario} | {len(group)} | {group[0]['training_days']} "
            f"| {np.mean(ours):.3f} (sd {np.std(ours, ddof=1) if len(ours) > 1 else 0:.3f}) "
            f"| {', '.join(f'{c:.3f}' for c in theirs)} "
            f"| {_span([g['margin_auprc'] for g in gate])} "
            f"| {_span([g['margin_recall_at_champion_alerts'] for g in gate])} "
            f"| {sum(not t['passed'] for t in group)} of {len(group)} |"
        )
    return "\n".join(lines)


def report(cut: dict, tolerances: dict[str, float]) -> str:
    """The cut's facts, its scenario table and the retrain-noise summary, in Markdown."""
    noise = noise_summary(cut["trials"], tolerances)
    head = (
        f"{cut['windows']} pseudo-days of {cut['hours_per_day']} h; champion and retrains on "
        f"the first {cut['history_days']}, judged on {', '.join(cut['held_out_days'])} "
        f"({cut['held_out_rows']} rows, {cut['held_out_frauds']} frauds); tolerances "
        f"{tolerances}"
    )
    champions = "; ".join(
        f"{c['training_days']}-day champion {c['version']}: validation AUPRC "
        f"{c['val_auprc']:.3f}{'' if c['floor_passed'] else ' (below the validation floor)'}"
        for c in cut["champions"]
    )
    lines = [head, "", f"Champions: {champions}.", "", scenario_table(cut["trials"]), ""]
    lines.append(
        f"Retrain noise over {noise['versions']} equally trained versions: the gate blocked "
        f"{noise['gate_false_blocks']} of {noise['gate_verdicts']} seed retrains; over all "
        f"{noise['ordered_pairs']} ordered pairs the rule blocks "
        f"{noise['pair_false_block_rate']:.0%}."
    )
    lines += ["", "| metric | mean | sd | sd of a margin | worst margin | blocked by it "
              "| tolerance for 5% |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for k in METRICS:
        m = noise[k]
        lines.append(
            f"| {k} | {m['mean']:.3f} | {m['sd']:.3f} | {m['margin_sd']:.3f} "
            f"| {m['worst_margin']:+.3f} | {m['pair_block_rate']:.0%} "
            f"| {m['tolerance_for_5pct']:.3f} |"
        )
    lines += ["", *sampling_lines(cut["trials"]), "", *budget_lines(cut)]
    return "\n".join(lines)


def sampling_lines(trials: Sequence[dict]) -> list[str]:
    """The bootstrap standard errors of the seed retrains that carry them, one line each."""
    out = []
    for t in trials:
        errors = t.get("bootstrap")
        if not errors:
            continue
        figures = ", ".join(
            f"{k}: champion se {errors[k]['champion_se']:.3f}, challenger se "
            f"{errors[k]['challenger_se']:.3f}, margin se {errors[k]['margin_se']:.3f}"
            for k in METRICS
        )
        out.append(f"- seed {t['seed']} against the champion, {errors['reps']} resamples of "
                   f"the held-out rows: {figures}")  # fmt: skip
    return out


# (AUPRC tolerance, recall tolerance, which recall): today's gate first, then the alternatives
# replayed. "budget" is recall when the challenger raises as many alerts as the champion (the
# gate's recall_at_champion_alerts); "threshold" is recall at each version's own alert
# threshold (what the gate compared before); None leaves recall out.
RULES: tuple[tuple[float, float | None, str], ...] = (
    (0.025, 0.075, "budget"),
    (0.025, 0.075, "threshold"),
    (0.025, 0.15, "threshold"),
    (0.025, 0.3, "threshold"),
    (0.05, 0.075, "threshold"),
    (0.025, None, "threshold"),
    (0.05, None, "threshold"),
    (0.05, 0.075, "budget"),
)
BAD = ("shuffled labels", "a tenth of the history, 10% flipped")
BETTER = "all history against a one-day champion"


def blocks(trial: dict, auprc: float, recall: float | None, kind: str) -> bool:
    """The gate's rule (no metric more than its tolerance below the champion's) on one
    retrain's measured figures."""
    gate = trial["gate"]
    if gate["margin_auprc"] < -auprc:
        return True
    if recall is None:
        return False
    figures = trial["budget_recall"]
    if kind == "threshold":
        figures = figures["threshold"]
    return figures["challenger"] - figures["champion"] < -recall


def rule_table(cuts: Sequence[dict]) -> str:
    """Each rule over every cut's retrains: equally good ones blocked, bad ones blocked, better
    ones promoted (pooled over the cuts)."""
    trials = [t for cut in cuts for t in cut["trials"]]
    groups = {
        "same history blocked": [t for t in trials if t["scenario"] == SAME],
        "bad retrains blocked": [t for t in trials if t["scenario"] in BAD],
        "better retrains promoted": [t for t in trials if t["scenario"] == BETTER],
    }
    lines = [
        f"| AUPRC tolerance | recall compared | {' | '.join(groups)} |",
        "|---|---|---|---|---|",
    ]
    for auprc, recall, kind in RULES:
        named = "not compared" if recall is None else f"{kind}, tolerance {recall}"
        cells = []
        for label, group in groups.items():
            hits = sum(blocks(t, auprc, recall, kind) for t in group)
            hits = len(group) - hits if label.endswith("promoted") else hits
            cells.append(f"{hits} of {len(group)}")
        lines.append(f"| {auprc} | {named} | {' | '.join(cells)} |")
    return "\n".join(lines)


def budget_lines(cut: dict) -> list[str]:
    """Per scenario, recall at the champion's alert budget: its margins over the retrains."""
    out = []
    for scenario in dict.fromkeys(t["scenario"] for t in cut["trials"]):
        group = [t["budget_recall"] for t in cut["trials"] if t["scenario"] == scenario]
        margins = [b["challenger"] - b["champion"] for b in group]
        alerts = sorted({b["alerts"] for b in group})
        out.append(
            f"- {scenario}: champion raises {', '.join(map(str, alerts))} alerts on "
            f"{group[0]['rows']} rows; recall margin at that budget {_span(margins)}"
        )
    return out
