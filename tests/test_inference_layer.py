"""inference/ is a plain library: no module in it imports Dagster or a layer above it (assets,
resources, orchestration, nightshift), directly or through what it imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ABOVE = ("dagster", "assets", "resources", "orchestration", "nightshift")


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_inference_module_imports_dagster_or_a_layer_above() -> None:
    found = {
        str(path.relative_to(REPO)): sorted(n for n in _imported(path) if n.split(".")[0] in ABOVE)
        for path in sorted((REPO / "inference").rglob("*.py"))
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_importing_all_of_inference_loads_no_dagster() -> None:
    probe = (
        "import importlib, pkgutil, sys, inference; "
        "[importlib.import_module(m.name) for m in "
        "pkgutil.walk_packages(inference.__path__, 'inference.')]; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({ABOVE!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"loaded by inference/: {done.stdout.strip()}"
