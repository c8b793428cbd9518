"""Overhead of checkpointed shards: fraud scoring of one partition with checkpoints on and off.

Runs both settings alternately in one process (this machine is noisy) and reports the ratio of
median times. Usage: `python -m benchmarks.checkpoint_overhead --rows 1000000 --repeats 3`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from dagster import DagsterInstance, materialize

from assets.fraud import fraud_model, fraud_scores
from assets.fraud.demo_data import generate_day
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

DAY, TRAIN_DAY = "2026-03-02", "2026-03-01"


def _resources(root: str, shard_rows: int) -> dict:
    return {
        "storage": StorageResource(data_root=root),
        "inference": InferenceResource(device="cpu", precision="fp32", shard_rows=shard_rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shard-rows", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, DagsterInstance.ephemeral() as instance:
        store = DataStore(root)
        generate_day(store, TRAIN_DAY, scale=0.05)
        generate_day(store, DAY, scale=args.rows / 100_000)
        assert materialize([fraud_model], resources=_resources(root, 0), instance=instance).success
        times: dict[int, list[float]] = {0: [], args.shard_rows: []}
        for _ in range(args.repeats):
            for shard_rows in times:
                started = time.perf_counter()
                result = materialize(
                    [fraud_scores],
                    partition_key=DAY,
                    resources=_resources(root, shard_rows),
                    instance=instance,
                    selection=[fraud_scores],
                )
                assert result.success
                times[shard_rows].append(time.perf_counter() - started)
        off, on = statistics.median(times[0]), statistics.median(times[args.shard_rows])
        print(
            json.dumps(
                {
                    "rows": store.read_output("fraud_scores", DAY).num_rows,
                    "shard_rows": args.shard_rows,
                    "seconds_checkpoints_off": round(off, 3),
                    "seconds_checkpoints_on": round(on, 3),
                    "overhead_ratio": round(on / off, 3),
                    "runs": {str(k): [round(t, 3) for t in v] for k, v in times.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
