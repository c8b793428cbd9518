"""Lets every Python process of a `nightshift ui` tree exit without the interpreter's last
garbage collection.

`nightshift ui` puts this folder first on the PYTHONPATH of `dagster dev`, so its webserver,
daemon, code servers and run workers all import it at start-up. A stop signal reaches all of
them at once, and each then spends most of its exit in CPython's final collection over every
object its imports made (Dagster, torch, the definitions), memory the operating system takes
back anyway. They also wait on one another (a code server for the run workers it started),
so the tree outlived the stop whenever anything else wanted the CPUs.

Freezing the heap in the last exit handler skips that collection: registered before any other,
it runs after all of them (log flushes, temporary-file clean-up, Dagster's own), and objects
freed by reference count are still finalised as usual; only garbage held in reference cycles
is left to the operating system.

It also silences one warning: Dagster 1.13 marks ``dagster dev`` superseded by ``dg dev`` (from
dagster-dg-cli, which nightshift does not use) and prints so at every ``nightshift ui``, which
reads as something to fix.
"""

import atexit
import gc
import warnings

atexit.register(gc.freeze)
warnings.filterwarnings("ignore", message="Function `dev_command` is superseded")
