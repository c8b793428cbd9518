"""A reader of one day of an output table in a process of its own, as Athena or Spark would be:
it polls the catalog and reads the day through pyiceberg and through DuckDB's iceberg_scan (on
S3 too, through its httpfs extension), and records what it saw, one JSON line per read, until a
stop file appears.

python tests/table_reader.py CATALOG_JSON TABLE DATE OUT STOP
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def duckdb_connection(catalog_props: dict | None = None):
    """DuckDB with its avro and iceberg extensions loaded from their PyPI packages (its own
    INSTALL would download them); for tables on S3 (``catalog_props`` holds an endpoint), its
    httpfs extension too, with a secret for that endpoint and the environment's keys."""
    import os
    from urllib.parse import urlparse

    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    con = duckdb.connect()
    packages = [(duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")]
    endpoint = (catalog_props or {}).get("s3.endpoint")
    if endpoint:
        packages.append((duckdb_extension_httpfs, "httpfs"))
    for package, name in packages:
        found = sorted(Path(package.__file__).parent.glob(f"**/{name}.duckdb_extension"))
        con.execute(f"LOAD '{found[0]}'")
    if endpoint:
        url = urlparse(endpoint)
        con.execute(
            "CREATE SECRET (TYPE s3, KEY_ID $key, SECRET $secret, REGION $region, "
            "ENDPOINT $endpoint, URL_STYLE 'path', USE_SSL $ssl)",
            {
                "key": os.environ["AWS_ACCESS_KEY_ID"],
                "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
                "region": catalog_props.get("s3.region", "us-east-1"),
                "endpoint": url.netloc,
                "ssl": url.scheme == "https",
            },
        )
    return con


def read_once(catalog, con, identifier: str, date: str) -> dict:
    from pyiceberg.expressions import EqualTo

    table = catalog.load_table(identifier)
    heads = {}
    for snapshot in table.snapshots():
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get("nightshift.date") == date and props.get("nightshift.kind") in (
            "published",
            "rolled back",
        ):
            heads[snapshot.sequence_number] = props
    head = heads[max(heads)] if heads else {}
    rows = table.scan(row_filter=EqualTo("date", date)).to_arrow().num_rows
    location = table.metadata_location
    if location.startswith("file://"):
        location = location.split("://", 1)[1]
    duck = con.execute(
        "select count(*) from iceberg_scan(?) where date = ?::date", [location, date]
    ).fetchone()[0]
    return {
        "t": time.time(),
        "rows": rows,
        "duckdb_rows": duck,
        "commit": head.get("nightshift.commit"),
        "commit_rows": json.loads(head["nightshift.rows"]) if head else None,
        "snapshot": table.current_snapshot().snapshot_id,
    }


def main(catalog_json: str, table: str, date: str, out: str, stop: str) -> None:
    from pyiceberg.catalog import load_catalog

    # A SQL catalog keys its tables by the catalog's name: the same name as the writers'.
    props = json.loads(catalog_json)
    catalog = load_catalog("nightshift", **props)
    con = duckdb_connection(props)
    with open(out, "a") as log:
        while not Path(stop).exists():
            try:
                seen = read_once(catalog, con, f"nightshift.{table}", date)
            except Exception as exc:  # noqa: BLE001 - recorded: the test fails on any
                seen = {"t": time.time(), "error": f"{type(exc).__name__}: {exc}"}
            log.write(json.dumps(seen) + "\n")
            log.flush()
            # A read takes tens of milliseconds already: polling harder would take a core from
            # the run under test and from the rest of the suite.
            time.sleep(0.1)


if __name__ == "__main__":
    main(*sys.argv[1:])
