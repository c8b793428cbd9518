"""A local Ray for one test module, and the markers its workers leave in a day's staging: what
the tests that stop, freeze or kill Ray workers share."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pyarrow.fs as pafs
import pytest

from inference.engine.shard_worker import RUNNING_DIR
from resources.storage import DataStore


def local_ray(module: ModuleType) -> Iterator[Any]:
    """A Ray session of two CPUs; the test ``module`` is pickled by value, so its model steps
    reach the workers without the tests folder on their path."""
    ray_module = pytest.importorskip("ray")
    from inference.engine.ray_pool import ray_session

    with ray_session("", num_cpus=2, num_gpus=0) as session:
        ray_module.cloudpickle.register_pickle_by_value(module)
        yield session


def started_shards(store: DataStore, asset: str, day: str) -> list[dict]:
    """The staging markers of the day's shards started (each names its worker as host:pid)."""
    target = store.partition_target(asset, day)
    selector = pafs.FileSelector(f"{target.staging_dir}/{RUNNING_DIR}", allow_not_found=True)
    found = []
    for info in target.fs.get_file_info(selector):
        try:
            with target.fs.open_input_stream(info.path) as stream:
                found.append(json.loads(stream.read()))
        except (OSError, ValueError):  # being written
            pass
    return found
