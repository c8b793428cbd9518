"""A challenger's shadow nights as plain values: one night it shadow-scored, and whether the
last N nights against the champion were clean, which a promotion gate with ``clean_nights``
requires.

Where a night's record is kept and read back is the asset layer's (``assets/shadow/nights.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ShadowNight:
    """One day a challenger scored in the shadow of the champion.

    Attributes:
        date: the partition.
        asset: the shadow asset (``<scored asset>_shadow``).
        challenger: the version that shadow-scored the day.
        champion: the version that scored it for real.
        figures: the agreement figures (inference/models/agreement.py).
        breaches: the limits the figures broke; empty on a clean night.
        error: why the shadow could not score or compare the day (then never clean).
        run_id: the run that recorded it.
    """

    date: str
    asset: str
    challenger: str
    champion: str
    figures: dict[str, float] = field(default_factory=dict)
    breaches: list[str] = field(default_factory=list)
    error: str | None = None
    run_id: str = ""

    @property
    def clean(self) -> bool:
        return self.error is None and not self.breaches

    def describe(self) -> str:
        """``2026-03-11 clean`` or ``2026-03-11 not clean (flagged_jaccard 0.41 < 0.5)``."""
        if self.clean:
            return f"{self.date} clean"
        why = f"failed: {self.error}" if self.error else "; ".join(self.breaches)
        return f"{self.date} not clean ({why})"


@dataclass(frozen=True)
class NightsVerdict:
    """Whether a challenger's last ``required`` nights against ``champion`` were clean."""

    model: str
    challenger: str
    champion: str
    required: int
    last: list[ShadowNight]

    @property
    def passed(self) -> bool:
        return len(self.last) >= self.required and all(n.clean for n in self.last)

    @property
    def clean(self) -> int:
        return sum(n.clean for n in self.last)

    def summary(self) -> str:
        """``2 of 2 clean shadow nights: 2026-03-11 clean, 2026-03-12 clean``, naming each
        night not clean and how many are missing."""
        head = f"{self.clean} of {self.required} clean shadow nights against {self.champion}"
        parts = [n.describe() for n in self.last]
        missing = self.required - len(self.last)
        if missing > 0:
            parts.append(
                f"{missing} night{'s' if missing > 1 else ''} missing: no shadow of "
                f"{self.challenger} recorded (the scoring job shadows it with NIGHTSHIFT_SHADOW=1)"
            )
        return f"{head}: {', '.join(parts)}" if parts else head

    def metadata(self) -> dict[str, int | str | bool]:
        return {
            "clean_nights_required": self.required,
            "clean_nights": self.clean,
            "shadow_nights": ", ".join(n.describe() for n in self.last),
            "shadow_passed": self.passed,
        }
