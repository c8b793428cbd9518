"""The promotion gate as plain values: what a domain's gate measures, the verdict on one
challenger, and which days it is judged and trained on.

A challenger replaces the champion only when it measures at least as well on the same
held-out days, the most recent labelled days that neither version trained on. Reading the
versions' windows, measuring them and moving the aliases is ``assets/promotion.py``'s; a store
here is only what a domain's functions are handed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.engine.device import Runtime
from inference.models.registry import AliasChange
from inference.models.shadow_nights import NightsVerdict

# Two labelled days: enough positives at demo scale for a fraud AUPRC, recent enough to judge
# the model that will score tomorrow.
DEFAULT_EVAL_DAYS = 2
Metrics = dict[str, float]
# (store, version, days, runtime) -> {metric: value}, higher is better for every metric.
Evaluate = Callable[[Any, str, list[str], Runtime], Metrics]


@dataclass(frozen=True)
class Gate:
    """How to judge a model's versions against each other.

    Attributes:
        model: the model's name in the store, which is also its asset key.
        metrics: the metrics compared, headline first; each must be higher-is-better.
        labelled_days: the days with labels to evaluate on, oldest first, read from the
            store it is handed.
        evaluate: scores one version on some of those days.
        tolerances: how far below the champion a challenger may measure on each metric and
            still be promoted: about how far apart two equally good versions measure on
            ``eval_days`` days (each domain's are measured in docs/models.md).
        eval_days: how many of the most recent days neither version trained on are used.
        clean_nights: how many of the challenger's most recent shadow nights against the
            champion must be clean (assets/shadow/) before it is promoted, on top of the
            metrics; 0, the default, promotes on the metrics alone.
    """

    model: str
    metrics: tuple[str, ...]
    labelled_days: Callable[[Any], list[str]]
    evaluate: Evaluate
    tolerances: Metrics
    eval_days: int = DEFAULT_EVAL_DAYS
    clean_nights: int = 0

    def __post_init__(self) -> None:
        if set(self.tolerances) != set(self.metrics):
            raise ValueError(f"{self.model}: a tolerance for each of {', '.join(self.metrics)}")
        if self.clean_nights < 0:
            raise ValueError(f"{self.model}: clean_nights {self.clean_nights} is negative")


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one challenger against the champion."""

    model: str
    challenger: str
    champion: str
    days: list[str]
    challenger_metrics: Metrics
    champion_metrics: Metrics
    tolerances: Metrics
    promoted: bool
    change: AliasChange | None = field(default=None, compare=False)
    nights: NightsVerdict | None = field(default=None, compare=False)

    @property
    def margins(self) -> Metrics:
        """Challenger minus champion, per metric."""
        return {
            k: round(self.challenger_metrics[k] - self.champion_metrics[k], 6)
            for k in self.challenger_metrics
        }

    def summary(self) -> str:
        """One line with both figures and the margin of every metric."""
        figures = "; ".join(
            f"{k}: challenger {self.challenger_metrics[k]:.4f} vs champion "
            f"{self.champion_metrics[k]:.4f} (margin {self.margins[k]:+.4f}, tolerance "
            f"{self.tolerances[k]})"
            for k in self.challenger_metrics
        )
        where = f"{self.days[0]}..{self.days[-1]}" if self.days else "no days"
        outcome = (
            f"{self.challenger} promoted to champion"
            if self.promoted
            else f"{self.challenger} stays challenger, champion {self.champion} keeps scoring "
            f"({promote_anyway(self.model, self.challenger)})"
        )
        head = f"{self.model} {self.challenger} against {self.champion} on {where}"
        nights = f": {self.nights.summary()}" if self.nights is not None else ""
        return f"{head}: {figures}{nights}: {outcome}"

    def metadata(self) -> dict[str, float | str | bool]:
        """Flat figures for the check's metadata: each metric of both, and the margin."""
        out: dict[str, float | str | bool] = {
            "challenger": self.challenger,
            "champion": self.champion,
            "promoted": self.promoted,
            "evaluation_days": ", ".join(self.days),
        }
        for k in self.challenger_metrics:
            out[f"challenger_{k}"] = round(self.challenger_metrics[k], 6)
            out[f"champion_{k}"] = round(self.champion_metrics[k], 6)
            out[f"margin_{k}"] = self.margins[k]
            out[f"tolerance_{k}"] = self.tolerances[k]
        if self.nights is not None:
            out.update(self.nights.metadata())
        return out


def parse_tolerances(raw: str, metrics: Sequence[str]) -> Metrics:
    """``0.05`` (every metric) or ``auprc=0.03,recall_at_champion_alerts=0.1`` (those named), as the
    ``NIGHTSHIFT_PROMOTION_TOLERANCE`` setting writes them; a name not among ``metrics`` is
    ignored, so one setting serves every model's gate."""
    out: Metrics = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        name, _, value = part.rpartition("=")
        try:
            number = float(value)
        except ValueError as exc:
            raise ValueError(f"tolerance {part!r} is not a number or metric=number") from exc
        if number < 0:
            raise ValueError(f"tolerance {part!r}: a tolerance is not negative")
        out.update({m: number for m in metrics if not name or name.strip() == m})
    return out


class CannotJudgeError(ValueError):
    """The gate cannot measure: no labelled day is free of both versions' training windows, or
    the champion's files are unusable. Only a person can promote then (``--force``)."""


def evaluation_days(
    labelled: Sequence[str], windows: Sequence[tuple[str, str] | None], n: int
) -> list[str]:
    """The most recent ``n`` labelled days inside none of the training windows, oldest first.

    A window of None (a version that did not record what it trained on) could hold any day,
    so no day is free of it.
    """
    if any(w is None for w in windows):
        return []
    free = [d for d in sorted(labelled) if not any(w[0] <= d <= w[1] for w in windows)]
    return free[-n:] if n > 0 else []


def training_days(labelled: Sequence[str], held_out: Sequence[str], history_days: int) -> list[str]:
    """The most recent ``history_days`` labelled days before the held-out ones."""
    before = [d for d in sorted(labelled) if not held_out or d < min(held_out)]
    return before[-history_days:] if history_days > 0 else []


def promote_anyway(name: str, version: str) -> str:
    """How a person promotes ``version`` past the gate, from the command line or the UI."""
    return (
        f"to promote it anyway, run `nightshift promote {name} --version {version} --force "
        f'--reason "..."`, or in the UI launch promote_model_job (Jobs, promote_model_job, '
        f"Launchpad) with ops: promote_model: config: {{model: {name}, version: {version}, "
        'force: true, reason: "..."}'
    )


def window_span(window: tuple[str, str] | None) -> str:
    """``<first>..<last>``: the days a version trained on, as the gate's messages name them."""
    return f"{window[0]}..{window[1]}" if window else "days it did not record"
