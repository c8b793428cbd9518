"""What a node costs per hour, from the price table shipped with nightshift (``prices.json``).

The table holds spot and on-demand USD per instance-hour for the common AWS GPU instances in
one region, with its date and source. The node type is a setting, ``NIGHTSHIFT_NODE_TYPE``
(default the instance type deploy/aws sizes its task definition for), and the two price
settings, ``NIGHTSHIFT_PRICE_SPOT_PER_HOUR`` and ``NIGHTSHIFT_PRICE_ON_DEMAND_PER_HOUR``,
each override its own column: a negotiated discount or another region is one variable away.
Nothing is read at import time; the environment is read when a price is asked for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

NODE_TYPE_SETTING = "NIGHTSHIFT_NODE_TYPE"
SPOT_PRICE_SETTING = "NIGHTSHIFT_PRICE_SPOT_PER_HOUR"
ON_DEMAND_PRICE_SETTING = "NIGHTSHIFT_PRICE_ON_DEMAND_PER_HOUR"
# deploy/aws/task-definition.json's cpu/memory are sized for it (deploy/aws/README.md).
DEFAULT_NODE_TYPE = "g5.xlarge"


@dataclass(frozen=True)
class NodePrices:
    """USD per node-hour on each capacity, and where the figures came from."""

    node_type: str
    spot_per_hour: float
    on_demand_per_hour: float
    source: str

    @property
    def label(self) -> str:
        """How cost figures should be captioned, e.g. ``at g5.xlarge prices``."""
        return f"at {self.node_type} prices"


@cache
def price_table() -> dict[str, Any]:
    """The shipped table (region, date, source, caveats and one entry per instance type)."""
    text = resources.files("policy").joinpath("prices.json").read_text(encoding="utf-8")
    return json.loads(text)


def known_node_types() -> list[str]:
    """Instance types the shipped table prices."""
    return sorted(price_table()["instances"])


def node_prices(
    node_type: str | None = None,
    *,
    spot_per_hour: float | None = None,
    on_demand_per_hour: float | None = None,
) -> NodePrices:
    """Prices of one node type: the table's, with each given override taking precedence.

    Args:
        node_type: an instance type such as ``g5.xlarge``; default ``DEFAULT_NODE_TYPE``.
        spot_per_hour: overrides the table's spot price.
        on_demand_per_hour: overrides the table's on-demand price.

    Raises:
        ValueError: the node type is not in the table and not both prices are given, or a
            price is not positive.
    """
    node_type = node_type or DEFAULT_NODE_TYPE
    table = price_table()
    entry = table["instances"].get(node_type)
    if entry is None and (spot_per_hour is None or on_demand_per_hour is None):
        raise ValueError(
            f"node type {node_type!r} is not in policy/prices.json ({table['region']}: "
            f"{', '.join(known_node_types())}); set both {SPOT_PRICE_SETTING} and "
            f"{ON_DEMAND_PRICE_SETTING} to price it"
        )
    spot = spot_per_hour if spot_per_hour is not None else entry["spot"]
    on_demand = on_demand_per_hour if on_demand_per_hour is not None else entry["on_demand"]
    for name, value in (("spot", spot), ("on-demand", on_demand)):
        if not value > 0:
            raise ValueError(f"{node_type}: {name} price must be > 0 USD/hour, got {value}")
    overridden = [
        name
        for name, given in (("spot", spot_per_hour), ("on-demand", on_demand_per_hour))
        if given is not None
    ]
    source = f"policy/prices.json, {table['region']}, compiled {table['compiled']}"
    if overridden:
        source += f"; {' and '.join(overridden)} set by hand"
    return NodePrices(node_type, float(spot), float(on_demand), source)


def node_prices_from_env(environ: Mapping[str, str] | None = None) -> NodePrices:
    """``node_prices`` for the node type and overrides the environment sets."""
    env = os.environ if environ is None else environ
    return node_prices(
        env.get(NODE_TYPE_SETTING) or None,
        spot_per_hour=_price(env, SPOT_PRICE_SETTING),
        on_demand_per_hour=_price(env, ON_DEMAND_PRICE_SETTING),
    )


def _price(env: Mapping[str, str], setting: str) -> float | None:
    raw = env.get(setting)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{setting}={raw!r} is not a number of USD per hour") from exc
