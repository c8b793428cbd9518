"""Engine behaviour the benchmark relies on: flat memory when streaming, continuous batching equal to generate, the harness itself."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import LlamaForCausalLM

from inference.generation.decoding import generate_continuous, generate_static, generate_tokens

REPO = Path(__file__).resolve().parents[1]
COLUMNS = [f"f{i}" for i in range(8)]

# Streams a parquet file through the engine (Arrow batches -> rebatch -> stacked features ->
# MLP -> parquet writer) and prints the peak RSS above the baseline taken after warm-up.
STREAM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq, torch
    from inference.engine.metrics import peak_rss_mb
    from inference.engine.batching import rebatch
    from inference.engine.device import make_runtime
    from inference.engine.streaming import ParquetRead, iter_parquet
    from inference.tabular.tabular import Standardizer, TabularScorer, build_mlp, stack_features

    torch.set_num_threads(1)
    source, target = sys.argv[1], sys.argv[2]
    columns = [f"f{i}" for i in range(8)]
    torch.manual_seed(0)
    scorer = TabularScorer(build_mlp(8, [32, 16]), Standardizer(np.zeros(8), np.ones(8)),
                           columns, 0.5, make_runtime("cpu", "fp32"))
    scorer.score(np.zeros((4096, 8), np.float32))
    baseline = peak_rss_mb()
    batches = rebatch(iter_parquet(source, ParquetRead(batch_size=65_536)), 4096)
    rows = 0
    schema = pa.schema([("id", pa.int64()), ("score", pa.float32())])
    with pq.ParquetWriter(target, schema) as writer:
        for batch in batches:
            scores = scorer.score(stack_features(batch, columns))
            writer.write_batch(pa.record_batch([batch["id"], pa.array(scores)], schema=schema))
            rows += len(scores)
    print(json.dumps({"rows": rows, "growth_mb": peak_rss_mb() - baseline,
                      "arrow_peak_mb": pa.default_memory_pool().max_memory() / 2**20}))
    """
)


def _write_file(path: Path, rows: int, chunk: int = 250_000) -> int:
    """A parquet file of ``rows`` x 8 float32 features, written a chunk at a time."""
    rng = np.random.default_rng(0)
    schema = pa.schema([("id", pa.int64()), *[(c, pa.float32()) for c in COLUMNS]])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            values = rng.normal(size=(len(COLUMNS), n)).astype(np.float32)
            arrays = [pa.array(np.arange(start, start + n)), *map(pa.array, values)]
            writer.write_table(pa.table(arrays, schema=schema), row_group_size=65_536)
    return rows * (8 + 4 * len(COLUMNS))


def _stream(tmp_path: Path, rows: int) -> tuple[dict, int]:
    source = tmp_path / f"in-{rows}.parquet"
    in_memory = _write_file(source, rows)
    done = subprocess.run(
        [sys.executable, "-c", STREAM_SCRIPT, str(source), str(tmp_path / f"out-{rows}.parquet")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), in_memory


def test_streaming_memory_stays_flat_as_the_file_grows(tmp_path: Path) -> None:
    small, small_bytes = _stream(tmp_path, 500_000)
    large, large_bytes = _stream(tmp_path, 6_000_000)

    assert (small["rows"], large["rows"]) == (500_000, 6_000_000)
    assert pq.ParquetFile(tmp_path / "out-6000000.parquet").metadata.num_rows == 6_000_000
    # Twelve times the rows (210 MB more once decoded), yet neither Arrow's live memory nor the
    # process's peak grows by more than a fraction of that. The peak's bound is a share of the
    # decoded growth, not a few batches: the allocator's pages settle early in a stream, by an
    # amount that differs from one process to the next (docs/benchmarks.md, "The daemon's retry under load");
    # reading the file whole would add all of the decoded growth.
    assert large["arrow_peak_mb"] <= small["arrow_peak_mb"] + 8
    assert large["arrow_peak_mb"] < 0.25 * large_bytes / 2**20
    decoded_growth_mb = (large_bytes - small_bytes) / 2**20
    assert large["growth_mb"] - small["growth_mb"] <= 0.3 * decoded_growth_mb


# -- generation strategies --------------------------------------------------------------------


def _requests(n: int = 12) -> tuple[list[list[int]], list[int]]:
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 96, int(k)).tolist() for k in rng.integers(3, 20, n)]
    return prompts, rng.integers(2, 12, n).tolist()


def _alone(model: LlamaForCausalLM, prompt: list[int], limit: int, eos: int | None) -> list[int]:
    """The reference: ``generate`` on one unpadded request, greedy."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=limit,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    tokens = out[0, len(prompt) :].tolist()
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tokens


LIMITS = {"max_batch_size": 4, "max_batch_tokens": 256}


def test_continuous_batching_equals_generate_for_greedy_decoding(llama) -> None:
    prompts, limits = _requests()
    reference = [_alone(llama, p, n, None) for p, n in zip(prompts, limits, strict=True)]

    continuous = generate_continuous(llama, prompts, limits, eos_token_id=None, **LIMITS)
    static = generate_static(llama, prompts, limits, pad_token_id=0, eos_token_id=None, **LIMITS)

    assert continuous.tokens == reference
    assert static.tokens == reference
    assert [len(t) for t in continuous.tokens] == limits
    assert continuous.useful_tokens == sum(limits)
    assert len(continuous.first_token_seconds) == len(prompts)
    assert len({tuple(t) for t in reference}) > 1
    # The model is left as it was found: continuous batching switches attention while it runs.
    assert llama.config._attn_implementation == "sdpa"


def test_both_strategies_stop_at_the_end_of_sequence_token(llama) -> None:
    prompts, limits = _requests()
    limits = [12] * len(prompts)
    # A token the model really produces, so some requests end early on it.
    eos = _alone(llama, prompts[0], 12, None)[3]
    reference = [_alone(llama, p, n, eos) for p, n in zip(prompts, limits, strict=True)]

    continuous = generate_continuous(llama, prompts, limits, eos_token_id=eos, **LIMITS)
    static = generate_static(llama, prompts, limits, pad_token_id=0, eos_token_id=eos, **LIMITS)

    assert continuous.tokens == reference == static.tokens
    assert len(reference[0]) == 4 and reference[0][-1] == eos


def test_auto_keeps_the_measured_faster_strategy_and_reuses_it(llama) -> None:
    prompts, limits = _requests(24)
    reference = [_alone(llama, p, n, None) for p, n in zip(prompts, limits, strict=True)]
    decisions: dict[str, str] = {}

    first = generate_tokens(
        llama,
        prompts,
        limits,
        pad_token_id=0,
        eos_token_id=None,
        decisions=decisions,
        probe_requests=4,
        **LIMITS,
    )
    rates = {
        k.removesuffix("_tokens_per_second"): v
        for k, v in first.probe.items()
        if k.endswith("_tokens_per_second")
    }
    assert set(rates) == {"static", "continuous"}
    # Continuous stopped early (clearly behind) loses whatever rate its finished requests show.
    winner = "static" if first.probe["continuous_stopped_early"] else max(rates, key=rates.get)
    assert decisions == {"cpu": winner}
    assert first.strategy == f"auto:{decisions['cpu']}"
    assert first.tokens == reference

    again = generate_tokens(
        llama,
        prompts,
        limits,
        pad_token_id=0,
        eos_token_id=None,
        decisions=decisions,
        probe_requests=4,
        **LIMITS,
    )
    assert again.strategy == first.strategy and again.probe == {}
    assert again.tokens == reference


def test_summaries_read_the_same_with_every_strategy(llama, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from inference.engine.device import make_runtime
    from inference.generation.generate import Generator, generate_summaries

    words = [f"w{i}" for i in range(80)]
    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["[PAD]", "[UNK]", "[EOS]"]
    raw.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=special))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token="[PAD]",
        unk_token="[UNK]",
        eos_token="[EOS]",
        padding_side="left",
    )
    generator = Generator(tokenizer, llama, make_runtime("cpu", "fp32"), False, "tiny@test")
    rng = np.random.default_rng(5)
    texts = [" ".join(rng.choice(words, int(n))) for n in rng.integers(3, 30, 10)]
    limits = {
        "max_new_tokens": 6,
        "max_input_tokens": 64,
        "max_batch_tokens": 256,
        "max_batch_size": 4,
    }

    static = generate_summaries(generator, texts, **limits)
    continuous = generate_summaries(generator, texts, strategy="continuous", **limits)
    auto = generate_summaries(generator, texts, strategy="auto", **limits)

    assert static.texts == continuous.texts == auto.texts
    assert all(static.texts) and len(set(static.texts)) > 1


def test_unknown_strategy_is_rejected(llama) -> None:
    with pytest.raises(ValueError, match="unknown strategy 'beam'"):
        generate_tokens(
            llama, [[3, 4]], [2], strategy="beam", pad_token_id=0, eos_token_id=None, **LIMITS
        )


# -- the benchmark harness --------------------------------------------------------------------


# The harness is benchmark code: it runs in its own process, as `make bench` runs it.
COMPARISON_SCRIPT = textwrap.dedent(
    """
    from benchmarks.common import Comparison

    rate = Comparison("w", "us", "them", 300.0, 100.0, "rows/s", True, 2.0)
    time_ = Comparison("w", "us", "them", 1.0, 1.5, "s", False, 1.0)
    assert (rate.ratio, rate.met) == (3.0, True)
    assert (time_.ratio, time_.met) == (1.5, True)
    assert Comparison("w", "us", "them", 2.0, 1.0, "s", False, 1.0).met is False
    """
)


def test_comparison_ratios_read_as_times_better() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COMPARISON_SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_bench_recommendations_smoke_run_writes_results(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--quick",
            "--only",
            "recs",
            "--scale",
            "0.25",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    (workload,) = results["workloads"]
    assert results["environment"]["torch_threads"] == 1
    peers = {c["peer"]: c for c in workload["comparisons"]}
    assert "faiss IndexFlatIP (no exclusion)" in peers
    assert all(c["ratio"] > 0 for c in peers.values())
    # faiss with over-fetch excludes seen items exactly as nightshift does: same lists.
    assert workload["facts"]["faiss_excluding_matches_nightshift"] == 1.0
    assert "| 2 recommendations top-K |" in (tmp_path / "results.md").read_text()
