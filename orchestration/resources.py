"""The one environment switch: which resources each environment runs with.

Every environment's map has the same keys. `NIGHTSHIFT_ENV` picks one (default `local`); secrets
and locations only ever come in through `EnvVar`, resolved when a run starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dagster import EnvVar

from inference.engine.streaming import LandingTimezones
from resources.inference import InferenceResource
from resources.landing_files import not_parquet_policy
from resources.serving import serving_from_env
from resources.storage import StorageResource

ENVIRONMENTS = ("local", "aws")


def _switch(text: str) -> bool:
    """An on/off setting: 1/true/yes/on or 0/false/no/off, any case."""
    word = text.strip().lower()
    if word in {"1", "true", "yes", "on"}:
        return True
    if word in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"not on or off: {text!r}")


# Engine settings an operator may tune per deployment without touching code.
ENGINE_SETTINGS = {
    "NIGHTSHIFT_MAX_BATCH_SIZE": ("max_batch_size", int),
    "NIGHTSHIFT_MAX_BATCH_TOKENS": ("max_batch_tokens", int),
    "NIGHTSHIFT_CPU_THREADS": ("cpu_threads", int),
    "NIGHTSHIFT_SHARD_ROWS": ("shard_rows", int),
    "NIGHTSHIFT_EXECUTOR": ("executor", str),
    "NIGHTSHIFT_RAY_ADDRESS": ("ray_address", str),
    "NIGHTSHIFT_RAY_WORKERS": ("ray_workers", int),
    "NIGHTSHIFT_RAY_CPUS_PER_WORKER": ("ray_cpus_per_worker", float),
    "NIGHTSHIFT_RAY_GPUS_PER_WORKER": ("ray_gpus_per_worker", float),
    "NIGHTSHIFT_SPOT_NOTICE": ("spot_notice", str),
    "NIGHTSHIFT_SPOT_ENDPOINT": ("spot_endpoint", str),
    "NIGHTSHIFT_NOTICE_POLL_SECONDS": ("notice_poll_seconds", float),
    "NIGHTSHIFT_STALL_SECONDS": ("stall_seconds", float),
    "NIGHTSHIFT_STALL_FLOOR_SECONDS": ("stall_floor_seconds", float),
    "NIGHTSHIFT_STALL_CEILING_SECONDS": ("stall_ceiling_seconds", float),
    "NIGHTSHIFT_STALL_BATCH_MULTIPLE": ("stall_batch_multiple", float),
    "NIGHTSHIFT_STALL_BACKSTOP_GRACE_SECONDS": ("stall_backstop_grace_seconds", float),
    "NIGHTSHIFT_BATCH_TIMEOUT_MULTIPLE": ("batch_timeout_multiple", float),
    "NIGHTSHIFT_BATCH_TIMEOUT_FLOOR_SECONDS": ("batch_timeout_floor_seconds", float),
    "NIGHTSHIFT_STRAGGLER_MULTIPLE": ("straggler_multiple", float),
    "NIGHTSHIFT_PROGRESS_LINE": ("progress_line", _switch),
    "NIGHTSHIFT_PROGRESS_FD": ("progress_fd", int),
    "NIGHTSHIFT_PRICE_SPOT_PER_HOUR": ("price_spot_per_hour", float),
    "NIGHTSHIFT_PRICE_ON_DEMAND_PER_HOUR": ("price_on_demand_per_hour", float),
    # Where each day's Prometheus metrics go (resources/run_metrics.py, docs/monitoring.md).
    "NIGHTSHIFT_PUSHGATEWAY_URL": ("metrics_pushgateway", str),
    "NIGHTSHIFT_METRICS_PUSH_SECONDS": ("metrics_push_seconds", float),
    "NIGHTSHIFT_METRICS_PORT": ("metrics_port", int),
    "NIGHTSHIFT_METRICS_JOB": ("metrics_job", str),
}


# Storage settings that describe the landing data rather than the machine, so every
# environment takes them; a zone name is checked when the code location loads.
STORAGE_SETTINGS = {
    "NIGHTSHIFT_LANDING_TIMEZONE": ("landing_timezone", str),
    "NIGHTSHIFT_LANDING_NOT_PARQUET": ("landing_not_parquet", str),
    # Where the output tables' catalog is (resources/outputstore.py), and an S3-compatible
    # endpoint for an s3:// data root (MinIO, or moto in tests).
    "NIGHTSHIFT_CATALOG": ("catalog", str),
    "NIGHTSHIFT_CATALOG_URI": ("catalog_uri", str),
    "NIGHTSHIFT_CATALOG_NAMESPACE": ("catalog_namespace", str),
    "NIGHTSHIFT_S3_ENDPOINT": ("s3_endpoint", str),
    "NIGHTSHIFT_S3_REGION": ("s3_region", str),
}


def engine_overrides() -> dict:
    """Inference settings given as environment variables (see docs/configuration.md)."""
    return _overrides(ENGINE_SETTINGS)


def storage_overrides() -> dict:
    """Storage settings given as environment variables (see docs/configuration.md)."""
    overrides = _overrides(STORAGE_SETTINGS)
    if "landing_timezone" in overrides:
        try:
            LandingTimezones.parse(overrides["landing_timezone"])
        except ValueError as exc:
            raise ValueError(f"NIGHTSHIFT_LANDING_TIMEZONE: {exc}") from exc
    if "landing_not_parquet" in overrides:  # a typo fails when the code location loads
        not_parquet_policy(overrides["landing_not_parquet"])
    return overrides


def _overrides(settings: dict[str, tuple[str, Callable[[str], Any]]]) -> dict:
    overrides = {}
    for variable, (field, kind) in settings.items():
        if os.environ.get(variable):
            try:
                overrides[field] = kind(os.environ[variable])
            except ValueError as exc:
                what = "on or off (1/0)" if kind is _switch else f"a {kind.__name__}"
                raise ValueError(f"{variable}={os.environ[variable]!r} is not {what}") from exc
    return overrides


def build_resources(env: str = "local") -> dict:
    """The resource map for an environment.

    Args:
        env: ``local`` (laptop or CI: local folder, CPU unless a GPU is present) or ``aws``
            (S3 data root, GPU node).
    """
    if env == "local":
        return {
            # data_root unset: $NIGHTSHIFT_DATA_ROOT at run time, else .nightshift/data in the repo.
            "storage": StorageResource(**storage_overrides()),
            "inference": InferenceResource(device="auto", precision="auto", **engine_overrides()),
            # The embedded SQLite file under the data root unless NIGHTSHIFT_SERVING says.
            "serving": serving_from_env(),
        }
    if env == "aws":
        return {
            "storage": StorageResource(
                **{
                    "data_root": EnvVar("NIGHTSHIFT_DATA_ROOT"),
                    "s3_region": EnvVar("AWS_REGION"),
                    **storage_overrides(),  # NIGHTSHIFT_S3_REGION wins over AWS_REGION
                }
            ),
            "inference": InferenceResource(
                **{
                    "device": "cuda",
                    "precision": "bf16",
                    "max_batch_size": 65_536,
                    "max_batch_tokens": 131_072,
                    # e.g. NIGHTSHIFT_EXECUTOR=ray for a day that outgrows one node (deploy/ray)
                    **engine_overrides(),
                }
            ),
            # On S3 the embedded file has no local home: NIGHTSHIFT_SERVING=postgres.
            "serving": serving_from_env(),
        }
    raise ValueError(f"unknown NIGHTSHIFT_ENV '{env}': expected one of {', '.join(ENVIRONMENTS)}")
