"""Runs the benchmark workloads and writes ``benchmarks/results.json`` and ``results.md``.

Every figure is a ratio between nightshift and a peer measured in the same run, with both
absolute values beside it. ``--quick`` shrinks every workload for a smoke run (CI, a laptop);
the default sizes are the issue's, except where noted in ``--help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.common import Workload, environment, quiet_logs, set_threads

HERE = Path(__file__).resolve().parent
WORKLOADS = (
    "fraud",
    "recs",
    "embeddings",
    "generation",
    "memory",
    "backfill",
    "small_files",
    "executor",
    "memory_keys",
    "publish",
    "serving",
    "watchdog",
    "metrics",
)

SIZES = {
    "full": {
        "fraud_rows": 1_000_000,
        "row_sample": 5_000,
        "micro_sample": 50_000,
        "users": 20_000,
        "items": 50_000,
        "dims": 64,
        "k": 20,
        "texts": 5_000,
        "requests": 256,
        "layers": 4,
        "width": 256,
        "memory_rows": 1_000_000,
        "memory_factor": 10,
        "partitions": 10,
        "partition_rows": 50_000,
        "small_files_rows": 100_000,
        "small_files": 500,
        "executor_rows": 1_000_000,
        "executor_shard_rows": 250_000,
        "executor_repeats": 3,
        "watchdog_rows": 1_000_000,
        "watchdog_shard_rows": 250_000,
        "watchdog_repeats": 3,
        "metrics_rows": 1_000_000,
        "metrics_shard_rows": 100_000,
        "metrics_repeats": 3,
        "memory_keys_scale": 5.0,
        "memory_keys_factor": 10,
        "memory_keys_shard_rows": 250_000,
        "publish_rows": 1_000_000,
        "publish_shard_rows": 50_000,
        "publish_repeats": 5,
        "publish_fraud_repeats": 3,
        "serving_users": 50_000,
        "serving_repeats": 3,
        "serving_docs": 2_000,
        "serving_news_docs": 2_000,
        "serving_news_queries": 500,
    },
    # benchmarks/gpu.sh: a CUDA box with many cores, all of it in under 8 minutes.
    "large": {
        "fraud_rows": 4_000_000,
        "row_sample": 5_000,
        "micro_sample": 50_000,
        "users": 100_000,
        "items": 200_000,
        "dims": 128,
        "k": 20,
        "texts": 20_000,
        "requests": 1_024,
        "layers": 8,
        "width": 1_024,
        "memory_rows": 1_000_000,
        "memory_factor": 10,
        "partitions": 10,
        "partition_rows": 100_000,
        "small_files_rows": 100_000,
        "small_files": 500,
        "executor_rows": 4_000_000,
        "executor_shard_rows": 250_000,
        "executor_repeats": 3,
        "watchdog_rows": 4_000_000,
        "watchdog_shard_rows": 250_000,
        "watchdog_repeats": 3,
        "metrics_rows": 1_000_000,
        "metrics_shard_rows": 100_000,
        "metrics_repeats": 3,
        "memory_keys_scale": 5.0,
        "memory_keys_factor": 10,
        "memory_keys_shard_rows": 250_000,
        "publish_rows": 1_000_000,
        "publish_shard_rows": 50_000,
        "publish_repeats": 5,
        "publish_fraud_repeats": 3,
        "serving_users": 50_000,
        "serving_repeats": 3,
        "serving_docs": 2_000,
        "serving_news_docs": 2_000,
        "serving_news_queries": 500,
    },
    "quick": {
        "fraud_rows": 100_000,
        "row_sample": 1_000,
        "micro_sample": 5_000,
        "users": 2_000,
        "items": 20_000,
        "dims": 64,
        "k": 20,
        "texts": 200,
        "requests": 48,
        "layers": 2,
        "width": 128,
        "memory_rows": 50_000,
        "memory_factor": 4,
        "partitions": 3,
        "partition_rows": 5_000,
        "small_files_rows": 20_000,
        "small_files": 100,
        "executor_rows": 100_000,
        "executor_shard_rows": 25_000,
        "executor_repeats": 1,
        "watchdog_rows": 100_000,
        "watchdog_shard_rows": 25_000,
        "watchdog_repeats": 2,
        "metrics_rows": 100_000,
        "metrics_shard_rows": 10_000,
        "metrics_repeats": 2,
        "memory_keys_scale": 0.2,
        "memory_keys_factor": 10,
        "memory_keys_shard_rows": 10_000,
        "publish_rows": 100_000,
        "publish_shard_rows": 10_000,
        "publish_repeats": 2,
        "publish_fraud_repeats": 1,
        "serving_users": 2_000,
        "serving_repeats": 1,
        "serving_docs": 200,
        "serving_news_docs": 200,
        "serving_news_queries": 50,
    },
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch/faiss/BLAS threads (default 1: on a shared 2-core box a "
        "second thread that waits for a busy core costs more than it gives)",
    )
    parser.add_argument(
        "--texts",
        type=int,
        help="texts for workload 3 (default 5,000; 1,000 "
        "keeps `make bench` to a few minutes on 2 cores)",
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda (memory and backfill run as deployed)"
    )
    parser.add_argument("--bf16", action="store_true", help="bf16 generation model (GPU)")
    parser.add_argument(
        "--large", action="store_true", help="the GPU sizes: more rows, texts and requests"
    )
    parser.add_argument("--fraud-batch", type=int, default=65_536, help="rows per model call")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the row/user counts")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for results.json/.md")
    parser.add_argument(
        "--budget", type=float, help="seconds: start no workload after this much time has passed"
    )
    parser.add_argument(
        "--plan", action="store_true", help="print the sizes and settings, then exit"
    )
    parser.add_argument(
        "--news-docs",
        type=int,
        help="workload 11: real news documents published for the vector search (default "
        "2,000; the sample has 9,997, of which --news-queries are held out as queries)",
    )
    parser.add_argument(
        "--news-queries", type=int, help="workload 11: held-out news queries (default 500)"
    )
    parser.add_argument(
        "--ann-sizes",
        type=int,
        nargs="*",
        default=[],
        help="workload 11: vector counts for the index at scale (none by default; beyond the "
        "news sample, real vectors plus gaussian perturbations)",
    )
    parser.add_argument(
        "--ann-settings",
        nargs="*",
        default=[],
        metavar="M:EFC:EFS",
        help="workload 11: HNSW settings (M:efConstruction:efSearch) tried at each --ann-sizes "
        "size (default: the serving target's own)",
    )
    parser.add_argument(
        "--vectors-cache",
        type=Path,
        help="workload 11: folder that keeps the news embeddings between runs (embedding the "
        "whole sample takes minutes on 2 cores)",
    )
    return parser.parse_args(argv)


def run_workload(name: str, args: argparse.Namespace, sizes: dict, work: Path) -> Workload:
    import torch

    threads, scale = args.threads, args.scale
    if name == "fraud":
        from benchmarks import fraud

        samples = {"row": sizes["row_sample"], "micro": sizes["micro_sample"]}
        rows = int(sizes["fraud_rows"] * scale)
        return fraud.run(work, rows, threads, args.fraud_batch, samples, args.device)
    if name == "recs":
        from benchmarks import recs

        users = int(sizes["users"] * scale)
        return recs.run(users, sizes["items"], sizes["dims"], sizes["k"], 4096, args.device)
    if name == "embeddings":
        from benchmarks import embeddings
        from inference.text.workers import CPU_BATCH_TOKENS

        # The CPU budget is the inference resource's own default there (its measurements:
        # docs/benchmarks.md, "Text batch budget"); GPUs want the large budget.
        tokens = CPU_BATCH_TOKENS if args.device == "cpu" else 131_072
        return embeddings.run(args.texts or sizes["texts"], tokens, 256, args.device)
    if name == "generation":
        from benchmarks import generation

        dtype = torch.bfloat16 if args.bf16 else torch.float32
        return generation.run(
            sizes["requests"], sizes["layers"], sizes["width"], args.device, dtype
        )
    if name == "memory":
        from benchmarks import memory

        rows = int(sizes["memory_rows"] * scale)
        return memory.run(work, rows, sizes["memory_factor"], threads, args.fraud_batch)
    if name == "small_files":
        from benchmarks import small_files

        rows = int(sizes["small_files_rows"] * scale)
        return small_files.run(work, rows, sizes["small_files"], threads, args.fraud_batch)
    if name == "executor":
        from benchmarks import executor

        rows = int(sizes["executor_rows"] * scale)
        return executor.run(
            work,
            rows,
            threads,
            args.fraud_batch,
            sizes["executor_shard_rows"],
            sizes["executor_repeats"],
        )
    if name == "watchdog":
        from benchmarks import watchdog

        rows = int(sizes["watchdog_rows"] * scale)
        return watchdog.run(
            work,
            rows,
            threads,
            args.fraud_batch,
            sizes["watchdog_shard_rows"],
            sizes["watchdog_repeats"],
        )
    if name == "metrics":
        from benchmarks import metrics_cost

        return metrics_cost.run(
            work,
            int(sizes["metrics_rows"] * scale),
            threads,
            args.fraud_batch,
            sizes["metrics_shard_rows"],
            sizes["metrics_repeats"],
        )
    if name == "memory_keys":
        from benchmarks import memory_keys

        return memory_keys.run(
            work,
            sizes["memory_keys_scale"] * scale,
            sizes["memory_keys_factor"],
            threads,
            sizes["memory_keys_shard_rows"],
        )
    if name == "publish":
        from benchmarks import publish

        return publish.run(
            work,
            int(sizes["publish_rows"] * scale),
            sizes["publish_shard_rows"],
            sizes["publish_repeats"],
            int(sizes["fraud_rows"] * scale),
            sizes["publish_fraud_repeats"],
            threads,
            args.fraud_batch,
        )
    if name == "serving":
        from benchmarks import serving

        users = int(sizes["serving_users"] * scale)
        docs = int(sizes["serving_docs"] * scale)
        vectors = serving.VectorRuns(
            news_docs=args.news_docs or sizes["serving_news_docs"],
            news_queries=args.news_queries or sizes["serving_news_queries"],
            ann_sizes=args.ann_sizes,
            ann_settings=[serving.hnsw_setting(text) for text in args.ann_settings],
            cache=args.vectors_cache,
        )
        return serving.run(work, users, 20, sizes["items"], sizes["serving_repeats"], docs, vectors)
    from benchmarks import backfill

    return backfill.run(work, sizes["partitions"], sizes["partition_rows"], threads)


def markdown(results: dict) -> str:
    """The results table: one row per comparison, ratio first, absolute values beside it."""
    env = results["environment"]
    lines = [
        f"Measured {results['finished']} on {env['processor']} ({env['cores_available']} cores "
        f"available, {env['torch_threads']} torch thread(s), device {env['device']}; load average "
        f"at start {env['load_average_at_start']}), profile `{results['profile']}`, "
        f"{results['seconds']:.0f} s in all. Ratio: how many times better nightshift is "
        "(rate over rate, or time/memory of the peer over nightshift's).",
        "",
        "| workload | nightshift | peer | ratio | target | nightshift value | peer value | note |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for w in results["workloads"]:
        for c in w.get("comparisons", []):
            target = "" if c["target"] is None else f"≥ {c['target']:g}"
            if c["met"] is not None:
                target += " ✅" if c["met"] else " ❌"
            lines.append(
                f"| {c['workload']} | {c['subject']} | {c['peer']} | {_ratio(c['ratio'])} | {target} "
                f"| {_value(c['subject_value'], c['unit'])} | {_value(c['peer_value'], c['unit'])} "
                f"| {c['note']} |"
            )
        if w.get("error") or w.get("skipped"):
            why = (w.get("error") or w["skipped"]).replace("\n", " ").replace("|", "/")
            lines.append(
                f"| {w['name']} | {'failed' if w.get('error') else 'skipped'} | | | | | | {why} |"
            )
    return "\n".join(lines) + "\n"


def _ratio(ratio: float) -> str:
    """Two decimals; a ratio under 0.1 to two significant digits, so it never reads 0.00x."""
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def _value(value: float, unit: str) -> str:
    if unit in ("rows/s", "texts/s", "tokens/s"):
        return f"{value:,.0f} {unit}" if value >= 100 else f"{value:,.1f} {unit}"
    return f"{value:,.3g} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = "quick" if args.quick else "large" if args.large else "full"
    sizes = SIZES[profile]
    if args.plan:
        print(
            json.dumps(
                {
                    "profile": profile,
                    "workloads": args.only,
                    "sizes": sizes,
                    "device": args.device,
                    "bf16": args.bf16,
                    "threads": args.threads,
                    "texts": args.texts or sizes["texts"],
                    "budget": args.budget,
                }
            )
        )
        return 0
    threads = set_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    results: dict = {"profile": profile, "environment": environment(threads), "workloads": []}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nightshift-bench-") as tmp, quiet_logs():
        for name in args.only:
            started = time.perf_counter()
            if args.budget is not None and started - began > args.budget:
                results["workloads"].append(
                    {"name": name, "skipped": f"time budget of {args.budget:.0f} s spent"}
                )
                continue
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            try:
                workload = run_workload(name, args, sizes, Path(tmp) / name)
                entry = {
                    "name": workload.name,
                    "facts": workload.facts,
                    "comparisons": [c.as_dict() for c in workload.comparisons],
                }
            except Exception as exc:  # one failed workload must not hide the others' figures
                entry = {
                    "name": name,
                    "error": _tail(f"{type(exc).__name__}: {exc}"),
                    "facts": {},
                    "comparisons": [],
                }
            entry["seconds"] = round(time.perf_counter() - started, 1)
            print(f"[bench] {name}: {entry['seconds']} s", file=sys.stderr, flush=True)
            results["workloads"].append(entry)
            # Written after every workload, so a run cut short still leaves its figures.
            write_results(results, began, args.out)
    print(write_results(results, began, args.out))
    return 1 if any(w.get("error") for w in results["workloads"]) else 0


def _tail(message: str, limit: int = 600) -> str:
    """The end of an error message: a child process's traceback ends with its cause."""
    return message if len(message) <= limit else message[:120] + " ... " + message[-limit:]


def write_results(results: dict, began: float, out: Path) -> str:
    results["seconds"] = round(time.perf_counter() - began, 1)
    results["finished"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    results["environment"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (out / "results.md").write_text("# Benchmark results\n\n" + table)
    return table


if __name__ == "__main__":
    sys.exit(main())
