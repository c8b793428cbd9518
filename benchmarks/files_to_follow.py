"""Files a reader opens to follow one fraud day: the repo modules whose code runs while it scores.

A small fraud model is trained and the definitions are imported first (not traced). Then, under
a profiler, one landing day of transactions is scored either the way an operator runs it,
``nightshift run --jobs fraud_scoring_job`` in this process to the published parquet (``--scope
cli``), or as a ``materialize`` of ``fraud_scores`` alone (``--scope asset``). Every repo file
outside benchmarks/ and tests/ with a function called during the traced part is listed, by
folder. A module's top level is not counted: importing a module is not following its code.

Usage: ``python -m benchmarks.files_to_follow [--scope cli|asset|both] [--rows N]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAY = "2026-03-09"
NOT_FOLLOWED = ("benchmarks/", "tests/", ".venv/")


@contextmanager
def traced_files() -> Iterator[set[str]]:
    """Collects the repo-relative path of every file whose code is called, in every thread."""
    seen: set[str] = set()
    prefix = f"{REPO}{os.sep}"

    def profile(frame, event: str, arg) -> None:
        if event == "call" and frame.f_code.co_name != "<module>":
            name = frame.f_code.co_filename
            if name.startswith(prefix):
                seen.add(name[len(prefix) :])

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def score_by_cli(root: Path) -> None:
    """``nightshift run`` for the fraud scoring job on ``DAY``, in this process."""
    from orchestration.cli import main

    argv = ["run", "--date", DAY, "--jobs", "fraud_scoring_job", "--data-root", str(root)]
    with redirect_stdout(sys.stderr):  # the run's own table, apart from the list of files
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"nightshift run exited {code}")


def score_by_materialize(root: Path) -> None:
    """``materialize`` of ``fraud_scores`` alone on ``DAY`` with the local resources."""
    from dagster import DagsterInstance, materialize

    from assets.fraud.assets import fraud_scores
    from benchmarks.common import QUIET_RUN_CONFIG, quiet_logs
    from benchmarks.fraud_data import resources

    with DagsterInstance.ephemeral() as instance, quiet_logs():
        result = materialize(
            [fraud_scores],
            partition_key=DAY,
            resources=resources(root, 1, 65_536),
            instance=instance,
            run_config=QUIET_RUN_CONFIG,
        )
    if not result.success:
        raise RuntimeError("materialising fraud_scores failed")


SCOPES: dict[str, Callable[[Path], None]] = {"cli": score_by_cli, "asset": score_by_materialize}


def followed(scope: str, rows: int, workdir: Path) -> list[str]:
    """The repo files (outside benchmarks/ and tests/) whose code ran while ``scope`` scored."""
    from benchmarks.fraud_data import train_model, write_partition

    root = workdir / scope / "data"
    os.environ["DAGSTER_HOME"] = str(workdir / scope / "dagster_home")
    train_model(root, threads=1)
    write_partition(root, DAY, rows)
    import orchestration.cli
    import orchestration.definitions  # noqa: F401  (what every run loads before its day)

    with traced_files() as seen:
        SCOPES[scope](root)
    return sorted(f for f in seen if f.endswith(".py") and not f.startswith(NOT_FOLLOWED))


def report(scope: str, files: list[str]) -> str:
    """The files grouped by folder, with the count of each folder and in all, as Markdown."""
    folders: dict[str, list[str]] = defaultdict(list)
    for file in files:
        folders[str(Path(file).parent)].append(Path(file).name)
    lines = [f"scope `{scope}`: {len(files)} files", ""]
    for folder, names in sorted(folders.items()):
        lines.append(f"- {folder}/ ({len(names)}): {', '.join(names)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scope", choices=[*SCOPES, "both"], default="both")
    parser.add_argument("--rows", type=int, default=20_000, help="transactions in the day")
    args = parser.parse_args(argv)
    scopes = list(SCOPES) if args.scope == "both" else [args.scope]
    with tempfile.TemporaryDirectory(prefix="files-to-follow-") as tmp:
        for scope in scopes:
            print(report(scope, followed(scope, args.rows, Path(tmp))), end="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
