"""Test-only fault injection for a day's commit in a real `dagster job execute` process.

tests/test_table_commits.py puts this folder first on the PYTHONPATH of the processes it starts,
with ``NIGHTSHIFT_TEST_FAULT=<action>@<point>[@<folder>]``:

- ``kill``: the process SIGKILLs itself at the point (a node that vanishes);
- ``fill``: a ballast file fills the filesystem of ``<folder>`` at the point, and the process
  carries on into a full disk.

Points, in the order a day's commit passes them:

- ``stage:<table>``: before the table's day is staged (its shard files already linked into the
  table's folder, its branch not yet written);
- ``checks``: every table staged, before the checks read the staged snapshots;
- ``publish:<table>``: checks passed, before the table's day is published;
- ``commit:<table>``: the day's manifests written, before the catalog commit that publishes it;
- ``published``: every table published, before the staging area is removed;
- ``shard:<n>``: the day's n-th shard of this process recorded in its progress file (a node
  that vanishes mid-day; tests/test_your_own_model.py).
"""

import os

SPEC = os.environ.get("NIGHTSHIFT_TEST_FAULT")


def _install(spec: str) -> None:
    import signal

    action, point, *where = spec.split("@")

    def fault(here: str) -> None:
        if here != point:
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "fill":
            ballast = os.path.join(where[0], "ballast")
            with open(ballast, "wb") as out:
                try:
                    while True:
                        out.write(b"\0" * (1 << 16))
                        out.flush()
                except OSError:  # full: the next write of the commit fails the same way
                    pass

    from pyiceberg.table import Table

    from inference.engine import tables

    stage, publish = tables.OutputTables.stage_files, tables.OutputTables.publish
    finish, do_commit = tables.StagedDay._finish, Table._do_commit
    reading = None

    def staged(self, name, *args, **kwargs):
        fault(f"stage:{name}")
        return stage(self, name, *args, **kwargs)

    def published(self, name, *args, **kwargs):
        fault(f"publish:{name}")
        return publish(self, name, *args, **kwargs)

    def finished(self):
        if self.published is not None:
            fault("published")
        return finish(self)

    def committed(self, updates, requirements):
        to_main = any(getattr(u, "ref_name", None) == "main" for u in updates)
        if to_main:
            fault(f"commit:{self.name()[-1]}")
        return do_commit(self, updates, requirements)

    tables.OutputTables.stage_files, tables.OutputTables.publish = staged, published
    tables.StagedDay._finish, Table._do_commit = finished, committed

    from resources import outputstore

    reading = outputstore.OutputStore.reading

    def checked(self, staged_day):
        if staged_day is not None:
            fault("checks")
        return reading(self, staged_day)

    outputstore.OutputStore.reading = checked

    from inference.engine import shard_writer

    record, recorded = shard_writer.ShardedWriter.record_shard, []

    def shard_recorded(self, *args, **kwargs):
        rows = record(self, *args, **kwargs)
        recorded.append(1)
        fault(f"shard:{len(recorded)}")
        return rows

    shard_writer.ShardedWriter.record_shard = shard_recorded


if SPEC:
    _install(SPEC)
