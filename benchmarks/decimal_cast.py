"""How a landed ``decimal(18, 2)`` becomes the contract's float64: Arrow's own cast against
``decimal_as_float`` (inference/engine/streaming.py) and against parsing each value's text.

The exact reference is the nearest double to each value, ``cents / 100`` in IEEE arithmetic
(one correctly rounded division of two exact doubles). Prints how many values each way misses
it, and the best of ``--repeats`` timings of each, as ratios to Arrow's cast, all in this
process.

    .venv/bin/python -m benchmarks.decimal_cast --rows 1000000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inference.engine.streaming import decimal_as_float


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cents = np.random.default_rng(args.seed).integers(0, 10**8, args.rows)  # up to 1,000,000.00
    # decimal128(18, 2) holding exactly these cents: each value's 128-bit unscaled integer is
    # its cents (low word; the high word of a positive value is 0).
    decimals = pa.Array.from_buffers(
        pa.decimal128(18, 2),
        args.rows,
        [None, pa.py_buffer(np.stack([cents, np.zeros_like(cents)], axis=1).tobytes())],
    )
    nearest = cents / 100.0
    ways = {
        "arrow cast": lambda: pc.cast(decimals, pa.float64()),
        "decimal_as_float": lambda: decimal_as_float(decimals),
        "via text": lambda: pc.cast(pc.cast(decimals, pa.string()), pa.float64()),
    }
    seconds = {name: _best(fn, args.repeats) for name, fn in ways.items()}
    print(f"{args.rows:,} decimal(18,2) values (0.00 to 999,999.99), seed {args.seed}")
    print("| way | values missing the nearest double | best seconds | over arrow cast |")
    print("|---|---|---|---|")
    for name, fn in ways.items():
        missed = int((fn().to_numpy(zero_copy_only=False) != nearest).sum())
        ratio = seconds[name] / seconds["arrow cast"]
        print(f"| {name} | {missed:,} | {seconds[name]:.4f} | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
