"""Statistics expectations that plainly pass, answered from the exact figures without GE.

A ``statistics`` expectation reads one row of exact figures. For the two kinds the suites use
there, a figure between bounds and two figures equal, on plain finite numbers the answer is
one comparison, while GE spends milliseconds of Python building and resolving each
expectation, whatever the rows. Only a pass is answered here: a failure, a null, a flag, a bound that is not
a plain number, or any other kind or argument goes to GE, which judges it and explains each
failure with its own result, so every verdict and its evidence are GE's (tests/test_quality.py
compares them with everything validated by GE).

Any conversion pandas or numpy makes on the way to GE rounds each side monotonically, so an
exact ``low <= value <= high`` or ``a == b`` here holds there too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

BETWEEN = "expect_column_values_to_be_between"
PAIR_EQUAL = "expect_column_pair_values_to_be_equal"
# The arguments each kind may carry to be answered here; any other (mostly, strict_min, a row
# condition) goes to GE.
ARGUMENTS = {BETWEEN: {"column", "min_value", "max_value"}, PAIR_EQUAL: {"column_A", "column_B"}}
_UNKNOWN = object()


def plainly_passes(
    expectation: dict, figures: Mapping[str, Any], parameters: Mapping[str, Any]
) -> bool:
    """Whether a statistics expectation certainly passes on ``figures``; False means ask GE.

    Args:
        expectation: one expectation of a suite's ``statistics`` part, as in its JSON.
        figures: the partition's exact figures, the one row GE would validate.
        parameters: values for ``{"$PARAMETER": name}`` bounds.
    """
    kind = expectation.get("type")
    kwargs = expectation.get("kwargs", {})
    allowed = ARGUMENTS.get(kind, set())
    if set(expectation) - {"type", "kwargs", "meta"} or not set(kwargs) <= allowed:
        return False
    if kind == PAIR_EQUAL:
        a, b = (_finite(_figure(figures, kwargs.get(k))) for k in ("column_A", "column_B"))
        return a is not _UNKNOWN and b is not _UNKNOWN and bool(a == b)
    value = _finite(_figure(figures, kwargs.get("column")))
    low, high = (_bound(kwargs.get(k), parameters) for k in ("min_value", "max_value"))
    if _UNKNOWN in (value, low, high) or (low is None and high is None):
        return False
    return bool((low is None or low <= value) and (high is None or value <= high))


def _figure(figures: Mapping[str, Any], column: Any) -> Any:
    return figures.get(column, _UNKNOWN) if isinstance(column, str) else _UNKNOWN


def _bound(raw: Any, parameters: Mapping[str, Any]) -> Any:
    """A bound as a plain number, None when absent, _UNKNOWN for anything else."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        if set(raw) != {"$PARAMETER"} or raw["$PARAMETER"] not in parameters:
            return _UNKNOWN
        raw = parameters[raw["$PARAMETER"]]
    return _finite(raw)


def _finite(value: Any) -> Any:
    """A finite, non-boolean real number as it is, else _UNKNOWN."""
    if value is _UNKNOWN or isinstance(value, bool) or not isinstance(value, Real):
        return _UNKNOWN  # numpy's booleans are not Real; its integers and floats are
    if isinstance(value, Integral):
        return value
    return value if math.isfinite(value) else _UNKNOWN
