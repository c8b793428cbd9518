"""Quality of the pipelines on real public data beside textbook baselines (``make eval``).

Not a benchmark (benchmarks/ times the engine against its peers): these modules score what the
assets and models produce, and read the public data sets that the summaries' trained sentence
scorer (:mod:`evaluation.train_ranker`) also learns from; the trainer's fitting is the model's
own (:mod:`inference.text.train_ranker`). They drive the assets through
Dagster, so they cannot live in ``inference/``, which has no Dagster import.
"""
