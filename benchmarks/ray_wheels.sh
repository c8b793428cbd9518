#!/usr/bin/env bash
# The Python 3.12 wheels that the ray executor needs on the lent GPU machine, which has torch,
# numpy, pyarrow, click, filelock, msgpack, packaging, protobuf, pyyaml, requests and attrs but
# neither Ray, jsonschema nor pydantic, and reaches no package index. Run it here (PyPI is
# reachable); benchmarks/gpu.sh installs what it leaves from the folder there.
#
#   benchmarks/ray_wheels.sh [DIR]     default DIR: .nightshift/wheels-py312 (git-ignored)
#
# Ray's wheel is 75.6 MiB and a call may carry 64 MiB in all, so it is re-zipped without
# ray/jars/ (the Java workers' 33 MiB jar, which Python never loads) and its RECORD rewritten
# without those entries, so pip installs it as a valid wheel. The rest: jsonschema and what it
# pulls in (rpds-py is compiled, hence cp312), and pydantic with its own, which Ray does not
# need but inference/engine/ray_pool.py imports (pydantic.v1, before Ray's serialiser first does);
# typing-extensions too, as pydantic 2.14 wants 4.16 and that image's version is not known.
# PYVER=3.11 builds the same set for 3.11 (to try the stripped wheel on this machine's Python).
# PYTHON picks the pip (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

pyver="${PYVER:-3.12}"
tag="cp${pyver/./}"
dir="${1:-.nightshift/wheels-py${pyver/./}}"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
# One version of each (two stop `pip install --no-index` there); the versions `.[ray]` resolves
# to on this machine's venv.
wheels=(ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
        rpds-py==2026.9.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5 typing-extensions==4.16.0)
mkdir -p "$dir"

download=()
for pin in "${wheels[@]}"; do
    name="${pin%%==*}"
    version="${pin##*==}"
    if ! compgen -G "$dir/${name//-/_}-${version}-*.whl" >/dev/null; then download+=("$pin"); fi
done
if [ "${#download[@]}" -gt 0 ]; then
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp --abi "$tag" --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$dir" "${download[@]}"
fi

# Ray without its jar: every other entry copied as it is (file modes included: gcs_server and
# raylet must stay executable), RECORD rewritten last without the removed files' lines.
"$python" - "$dir" <<'PY'
import re
import sys
import zipfile
from pathlib import Path

DROP = "ray/jars/"
for wheel in Path(sys.argv[1]).glob("ray-*.whl"):
    with zipfile.ZipFile(wheel) as src:
        if not any(n.startswith(DROP) for n in src.namelist()):
            continue  # stripped already
        # The wheel's own RECORD, not those of the packages Ray vendors below ray/.
        record = next(n for n in src.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n))
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
            for info in src.infolist():
                if info.filename.startswith(DROP) or info.filename == record:
                    continue
                out.writestr(info, src.read(info), zipfile.ZIP_DEFLATED, 9)
            lines = src.read(record).decode().splitlines(keepends=True)
            kept = [line for line in lines if not line.startswith(DROP)]
            out.writestr(src.getinfo(record), "".join(kept), zipfile.ZIP_DEFLATED, 9)
    tmp.replace(wheel)
    print(f"stripped {DROP} from {wheel.name}: {len(lines) - len(kept)} files dropped")
PY

# pip's own check that the set installs as Python $pyver wheels (it resolves, installs nothing).
"$python" -m pip install -q --dry-run --no-deps --no-index --only-binary=:all: \
    --python-version "$pyver" --implementation cp --target "$(mktemp -d)" "$dir"/*.whl
du -b "$dir"/*.whl | awk '{printf "%8.1f MiB  %s\n", $1 / 1048576, $2; t += $1}
    END {printf "%8.1f MiB  in all (a call carries 64 MiB with the working tree)\n", t / 1048576}'
