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
# How often `dagster dev` heartbeats its code-server proxy and restarts it if it is gone (its
# default is 5 s). It restarts it also while it is itself stopping, after the stop signal that
# ended the proxy too, and the new proxy then outlives the stop: a longer period makes that
# rarer. It stays well under the proxy's heartbeat timeout (45 s), past which it would stop.
CODE_SERVER_CHECK_SECONDS = "20"


def dagster_dev_command(host: str, port: int) -> list[str]:
    """`dagster dev` on the project's workspace, from the same environment as this Python."""
    dagster = Path(sys.executable).parent / "dagster"
    return [str(dagster), "dev", "-w", str(WORKSPACE), "-h", host, "-p", str(port)]


def dagster_dev_environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with :data:`EXIT_SITE` first on PYTHONPATH, where every process of the tree
    (each one a new interpreter that inherits the environment) finds its sitecustomize, and
    the code-server check period of :data:`CODE_SERVER_CHECK_SECONDS`."""
    paths = [str(EXIT_SITE), *filter(None, base.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        **base,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
        "DAGSTER_CODE_SERVER_AUTO_RESTART_INTERVAL": CODE_SERVER_CHECK_SECONDS,
    }


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
