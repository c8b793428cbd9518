"""The one environment switch: which resources each environment runs with.

Every environment's map has the same keys. `NIGHTSHIFT_ENV` picks one (default `local`); secrets
and locations only ever come in through `EnvVar`, resolved when a run starts.
"""

from __future__ import annotations

from dagster import EnvVar

from resources.inference import InferenceResource
from resources.storage import StorageResource

ENVIRONMENTS = ("local", "aws")


def build_resources(env: str = "local") -> dict:
    """The resource map for an environment.

    Args:
        env: ``local`` (laptop or CI: local folder, CPU unless a GPU is present) or ``aws``
            (S3 data root, GPU node).
    """
    if env == "local":
        return {
            # data_root unset: $NIGHTSHIFT_DATA_ROOT at run time, else .nightshift/data in the repo.
            "storage": StorageResource(),
            "inference": InferenceResource(device="auto", precision="auto"),
        }
    if env == "aws":
        return {
            "storage": StorageResource(
                data_root=EnvVar("NIGHTSHIFT_DATA_ROOT"), s3_region=EnvVar("AWS_REGION")
            ),
            "inference": InferenceResource(
                device="cuda", precision="bf16", max_batch_size=65_536, max_batch_tokens=131_072
            ),
        }
    raise ValueError(f"unknown NIGHTSHIFT_ENV '{env}': expected one of {', '.join(ENVIRONMENTS)}")
