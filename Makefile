# nightshift: `make run` scores yesterday on demo data; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export DAGSTER_HOME ?= $(CURDIR)/.nightshift/dagster_home
# Models come from installed packages or local paths; nothing may be fetched from a hub.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install run test ui clean

install: $(STAMP)

# torch 2.13.0 first: its CPU wheel is on this machine's disk, and the project's range is
# satisfied by it; any other torch requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	$(BIN)/pip check
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/nightshift run --generate-days 3

test: $(STAMP)
	$(BIN)/pytest

ui: $(STAMP)
	mkdir -p "$(DAGSTER_HOME)"
	test -f "$(DAGSTER_HOME)/dagster.yaml" || cp deploy/local/dagster.yaml "$(DAGSTER_HOME)/dagster.yaml"
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf .nightshift
