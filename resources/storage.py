"""Partitioned data storage on a local folder or S3, behind one interface, and the Dagster
resource that configures it.

Layout (Hive-style, readable by pyarrow, Spark, DuckDB, Athena):
``<root>/landing/<dataset>/date=YYYY-MM-DD/*.parquet`` for inputs and
``<root>/outputs/<asset>/date=YYYY-MM-DD/`` for published outputs (see ``resources.filestore``).
:class:`DataStore` (``resources.datastore``) reads landing partitions and publishes outputs;
the names callers use are importable from here.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from resources.datastore import DataStore
from resources.landing_files import LandingDataError
from resources.outputstore import Published

__all__ = [
    "DEFAULT_DATA_ROOT",
    "REPO_ROOT",
    "DataStore",
    "LandingDataError",
    "Published",
    "StorageResource",
    "default_data_root",
    "store_from_env",
]


REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_ROOT = REPO_ROOT / ".nightshift" / "data"


def store_from_env() -> DataStore:
    """The store the command line uses: ``$NIGHTSHIFT_DATA_ROOT`` and the storage settings
    given as environment variables (S3 endpoint and region, catalog), as a run's resources
    take them (orchestration/resources.py)."""
    return DataStore(
        default_data_root(),
        os.environ.get("NIGHTSHIFT_S3_ENDPOINT") or None,
        os.environ.get("NIGHTSHIFT_S3_REGION") or os.environ.get("AWS_REGION") or None,
        catalog=os.environ.get("NIGHTSHIFT_CATALOG") or None,
        catalog_uri=os.environ.get("NIGHTSHIFT_CATALOG_URI") or None,
        catalog_namespace=os.environ.get("NIGHTSHIFT_CATALOG_NAMESPACE") or None,
    )


def default_data_root() -> str:
    """``$NIGHTSHIFT_DATA_ROOT``, else ``.nightshift/data`` inside the repository."""
    return os.environ.get("NIGHTSHIFT_DATA_ROOT") or str(DEFAULT_DATA_ROOT)


class StorageResource(ConfigurableResource):
    """Where nightshift reads landing data and publishes outputs: a folder or an S3 prefix."""

    data_root: str | None = Field(
        default=None,
        description="Local folder or s3://bucket/prefix; default $NIGHTSHIFT_DATA_ROOT or "
        ".nightshift/data in the repository.",
    )
    s3_endpoint: str | None = Field(default=None, description="S3-compatible endpoint override.")
    s3_region: str | None = Field(default=None, description="S3 region.")
    landing_timezone: str | None = Field(
        default=None,
        description="Whose wall-clock time landing timestamps without a time zone are: an IANA "
        "zone for every dataset (America/New_York), per dataset (transactions=America/New_York,"
        "documents=Europe/Paris), or both; unset rejects them.",
    )

    landing_not_parquet: str | None = Field(
        default=None,
        description="What a landing file that is not parquet (by its bytes: CSV, JSON, a stray "
        "manifest) does to its day: 'fail' (the day fails naming the file and what it looks "
        "like) or 'skip' (it is skipped, named in the log and counted in landing_files_skipped); "
        "default $NIGHTSHIFT_LANDING_NOT_PARQUET, else 'fail'.",
    )

    catalog: str | None = Field(
        default=None,
        description="The output tables' Iceberg catalog: 'sql' (default; a SQLite file under "
        "the data root unless catalog_uri names another database), 'glue' or 'rest'; default "
        "$NIGHTSHIFT_CATALOG.",
    )
    catalog_uri: str | None = Field(
        default=None,
        description="The catalog's URI: a SQLAlchemy URI for 'sql', the server for 'rest'; "
        "default $NIGHTSHIFT_CATALOG_URI.",
    )
    catalog_namespace: str | None = Field(
        default=None,
        description="The output tables' namespace in the catalog, dotted when nested "
        "('gold.nightshift'); default $NIGHTSHIFT_CATALOG_NAMESPACE, else 'nightshift'.",
    )

    # One store for the resource's life: the steps of a run (one process, in-process executor)
    # then check each landing file's footer once, not once per step.
    _store: DataStore | None = PrivateAttr(default=None)

    def store(self) -> DataStore:
        if self._store is None:
            self._store = DataStore(
                self.data_root or default_data_root(),
                self.s3_endpoint,
                self.s3_region,
                landing_timezone=self.landing_timezone,
                landing_not_parquet=self.landing_not_parquet,
                catalog=self.catalog,
                catalog_uri=self.catalog_uri,
                catalog_namespace=self.catalog_namespace,
            )
        return self._store
