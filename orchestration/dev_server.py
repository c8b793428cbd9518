"""`dagster dev` as `nightshift ui` (and `make ui`) starts it: the command line and the
environment of its process tree, so that a stop signal brings the whole tree down promptly."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from resources.storage import REPO_ROOT

# Holds only sitecustomize.py: on PYTHONPATH it adds no other importable name.
EXIT_SITE = Path(__file__).resolve().parent / "dev_site"
WORKSPACE = REPO_ROOT / "workspace.yaml"


def dagster_dev_command(host: str, port: int) -> list[str]:
    """`dagster dev` on the project's workspace, from the same environment as this Python."""
    dagster = Path(sys.executable).parent / "dagster"
    return [str(dagster), "dev", "-w", str(WORKSPACE), "-h", host, "-p", str(port)]


def dagster_dev_environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with :data:`EXIT_SITE` first on PYTHONPATH, where every process of the tree
    (each one a new interpreter that inherits the environment) finds its sitecustomize."""
    paths = [str(EXIT_SITE), *filter(None, base.get("PYTHONPATH", "").split(os.pathsep))]
    return {**base, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def exec_dagster_dev(host: str, port: int) -> None:
    """Replaces this process with `dagster dev`, which keeps its pid and process group: a
    Ctrl-C, or a signal to the group, reaches every process that `dagster dev` starts."""
    command = dagster_dev_command(host, port)
    # Each Dagster process gives SIGTERM whatever SIGINT does. Started with SIGINT ignored (as
    # a shell starts a script's background job), the whole tree would ignore SIGTERM as well
    # and outlive every stop signal but SIGKILL; an ignored signal stays ignored across exec.
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_DFL)
    sys.stdout.flush()  # what this process printed would be lost in the exec
    sys.stderr.flush()
    os.chdir(REPO_ROOT)
    os.execve(command[0], command, dagster_dev_environment(os.environ))
