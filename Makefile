# nightshift: `make run` scores yesterday on demo data; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export DAGSTER_HOME ?= $(CURDIR)/.nightshift/dagster_home
# Models come from installed packages or local paths; nothing may be fetched from a hub.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install browser postgres redis prometheus run test ui clean bench bench-quick bench-quality eval

install: $(STAMP)

# torch 2.13.0 first: its CPU wheel is on this machine's disk, and the project's range is
# satisfied by it; any other torch requirement would pull a multi-GB CUDA build. The bench
# extra (faiss-cpu, a benchmark peer), the eval extra (rouge-score) and the ray extra (the ray
# executor, whose tests start a local Ray) are installed too, so `make test` runs their tests.
# MLflow gets an environment of its own (.venv-mlflow): the MLflow mirror's test starts its
# server from there; mlflow pins pyarrow below this stack's, and nightshift only speaks its
# REST API, so the pipelines need no mlflow package. So does the Iceberg REST catalog server the
# REST catalog tests start (.venv-rest-catalog: Lakana's, whose botocore is not dagster-aws's).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,bench,eval,ray]'
	$(BIN)/pip check
	test -x .venv-mlflow/bin/mlflow || ($(PYTHON) -m venv .venv-mlflow && \
	  .venv-mlflow/bin/pip install -q --disable-pip-version-check mlflow==3.17.2)
	test -x .venv-rest-catalog/bin/lakana-server || ($(PYTHON) -m venv .venv-rest-catalog && \
	  .venv-rest-catalog/bin/pip install -q --disable-pip-version-check lakana-server==0.20.0)
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/nightshift run --generate-days 3

# Everything the suite needs is set up here, so `make test` alone passes on a fresh machine:
# the project (above), Debian's Chromium for the UI test, Debian's PostgreSQL server for the
# catalog tests, Debian's redis-server for the serving tests and Debian's prometheus and
# prometheus-pushgateway for the metrics tests (each installed through apt when missing).
# Two pytest-xdist workers, one per core of the smallest machine the suite runs on. A third
# filled the cores' idle time for a few percent of wall time (docs/benchmarks.md, "The daemon's retry under load"),
# but it overloads them: the tests that wait on a real daemon or a stop signal then missed
# their marks in fresh-clone CIs (docs/benchmarks.md, "Fresh-clone CI runs"). Tests that must not overlap
# are grouped in tests/conftest.py. TEST_WORKERS=0 runs in one process; PYTEST_ARGS adds options.
TEST_WORKERS ?= 2
test: $(STAMP) browser postgres redis prometheus
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

browser:
	bash deploy/local/install-browser.sh

postgres:
	bash deploy/local/install-postgres.sh

redis:
	bash deploy/local/install-redis.sh

prometheus:
	bash deploy/local/install-prometheus.sh

# The throughput benchmark, every workload: writes benchmarks/results.json and .md (how long it
# takes: docs/benchmarks.md). BENCH_ARGS passes options through, e.g. BENCH_ARGS="--threads 2
# --texts 5000"; 500 texts keep workload 3 to a small share of the run.
bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench --texts 500 $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.bench --quick --out .nightshift/bench $(BENCH_ARGS)

# What the data-quality gates cost on a 1M-row fraud partition, against scoring it.
bench-quality: $(STAMP)
	$(BIN)/python -m benchmarks.quality --rows 1000000 --threads 1 --work .nightshift/bench/quality

# Quality on real public data beside the textbook baselines (evaluation/run.py): the fraud data
# is committed; MovieLens and CNN/DailyMail may not be redistributed and live in the git-ignored
# .nightshift/eval/ cache (a missing one is reported with the way to get it).
eval: $(STAMP)
	$(BIN)/python -m evaluation.run $(EVAL_ARGS)

# nightshift ui takes the instance lock that every nightshift command takes (the shipped config,
# refreshed when it changed, and the storage exist before the daemon or any other command opens
# them), then becomes dagster dev on workspace.yaml at 127.0.0.1:3000 (orchestration/dev_server.py).
ui: $(STAMP)
	$(BIN)/nightshift ui

clean:
	rm -rf .nightshift
