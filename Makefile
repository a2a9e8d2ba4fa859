# A newcomer needs two commands: `make demo` and `make test`. Both create .venv when it is
# missing and install what they need; stamp files inside .venv make repeat runs skip the installs.
#
#   make demo    walk-through: a CUA run, resume, replay elsewhere; ends writing demo-out/*.html
#   make test    tox: everything on py311-full (started first, beside the others), format tests on
#                py310, py312, py313 (no torch/Ray; tox.ini says what they leave to py311-full);
#                10-20 min on 2 cores, progress live (lines prefixed by env); ends with each env's
#                pass/fail/skip counts. MILES_SOURCE=/path/to/miles names a Miles checkout for the
#                Miles tests (default ../shared/miles; without one they skip)
#   make lint    ruff check + mypy (`make format` applies ruff format)
#   make bench   benchmarks/bench_save.py (BENCH_ARGS="--n 600 --repeats 3")
#   make bench-replay   benchmarks/bench_replay.py: replay rebuild peak memory, fp32 vs bf16
#   make mutants mutation testing with mutmut (not in CI; hours on 2 cores; docs/TESTING.md)
#   make mutants-safety   the same over the safety core only (proof, deletion, publish), in build/
#   make clean   remove build/test/demo/bench outputs (keeps .venv); `make distclean` also .venv

PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# The CPU wheel in pip's find-links. Installed before anything else, so that no resolver ever
# pulls a multi-GB CUDA build to satisfy some later package.
TORCH  := torch==2.13.0
BENCH_ARGS ?=
DEMO_ARGS  ?=
TOX_ARGS   ?=

# Tests and the demo never reach a model hub or a Ray cluster's auth service.
export HF_HUB_OFFLINE := 1
export RAY_AUTH_MODE := disabled

# With pyenv, shims answer `python3.10` etc. only for the selected versions. Select the newest
# installed 3.11, 3.10, 3.12 and 3.13 (3.11 first, so `python3` stays 3.11) so that tox finds
# every interpreter; tox.ini passes PYENV_VERSION through to its interpreter discovery.
ifeq ($(origin PYENV_VERSION),undefined)
ifneq ($(shell command -v pyenv 2>/dev/null),)
PYENV_PICK := $(shell for m in 11 10 12 13; do pyenv versions --bare --skip-aliases 2>/dev/null | grep -E '^3\.'$$m'\.[0-9]+$$' | sort -V | tail -n1; done | paste -sd: -)
ifneq ($(PYENV_PICK),)
export PYENV_VERSION := $(PYENV_PICK)
endif
endif
endif

VENV_OK   := $(VENV)/.stamp-venv
TORCH_OK  := $(VENV)/.stamp-torch
DEV_OK    := $(VENV)/.stamp-dev
NODE_OK   := $(VENV)/.stamp-node
# s3rver 3.7.1 (npm): a real S3 emulator that ignores If-None-Match and If-Match, for the tests of
# the store probe (tests/test_store_preconditions.py). Pinned: the tests rely on what it ignores.
S3RVER := s3rver@3.7.1
# Azurite, Azure Storage's emulator, for the az:// locations of tests/test_locations.py.
AZURITE := azurite@3.35.0

.PHONY: demo test lint format bench bench-replay mutants mutants-safety venv clean distclean

# DEMO_ARGS=--keep keeps its temporary directory, to run the commands it prints on it.
demo: $(DEV_OK)
	$(BIN)/python examples/demo.py $(DEMO_ARGS)

# 10-20 minutes on 2 cores. Output is live: tox's own lines as each env starts (creating it,
# installing into it) and pytest's progress, each line prefixed by its env's name (the envs run
# in parallel, one per core, so their lines interleave; py311-full, the longest, is first in
# tox.ini's env_list, so it starts at once and the light envs run one after another beside it);
# ends with each tox env's passed/failed/skipped counts, whether or not tox passed.
test: $(DEV_OK) $(NODE_OK)
	rm -rf .tox/junit
	@echo "make test: tox envs in parallel ($$($(BIN)/tox -l | paste -sd' ' -), unless TOX_ARGS picks others); 10-20 minutes on 2 cores"
	$(BIN)/tox run-parallel --parallel auto --parallel-live --parallel-no-spinner $(TOX_ARGS); \
	status=$$?; $(BIN)/python .ci/test_summary.py .tox/junit; exit $$status

lint: $(DEV_OK)
	$(BIN)/ruff check .
	$(BIN)/mypy

format: $(DEV_OK)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(DEV_OK)
	$(BIN)/python benchmarks/bench_save.py $(BENCH_ARGS)

bench-replay: $(DEV_OK)
	$(BIN)/python benchmarks/bench_replay.py $(BENCH_ARGS)

# Config in pyproject.toml [tool.mutmut]. PYTHONPATH points subprocesses started by tests at the
# mutated copy too (mutmut itself puts mutants/ first on its own sys.path). mutants/ must exist
# before Python starts: a PYTHONPATH entry that does not exist yet is cached as "no importer"
# and trainer_hooks would not be found later. The mutants profile derandomizes hypothesis.
# Results are cached in mutants/: a rerun only tests what changed.
MUTMUT_ARGS ?= --max-children 2
mutants: $(DEV_OK)
	mkdir -p mutants
	HYPOTHESIS_PROFILE=mutants PYTHONPATH=$(CURDIR)/mutants TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 \
		nice -n 10 $(BIN)/mutmut run $(MUTMUT_ARGS)
	$(BIN)/mutmut export-cicd-stats && cat mutants/mutmut-cicd-stats.json
	$(BIN)/mutmut results | grep -v ': not checked$$' || true

# The bundle proof, the deletion primitive and the publish path only (issue 36): mutmut reads its
# config only from pyproject.toml, so scripts/mutants_safety.py copies the tree git knows into
# $(SAFETY_DIR) and narrows [tool.mutmut] there (the modules, the tests that exercise them); plain
# `make mutants` is unchanged. Cached in $(SAFETY_DIR)/mutants like `make mutants`; ends with the
# score per module. MUTMUT_ARGS='--max-children 2 "bundles._local.proof*"' reruns some mutants.
SAFETY_DIR ?= build/mutants-safety
mutants-safety: $(DEV_OK)
	$(BIN)/python scripts/mutants_safety.py --dest $(SAFETY_DIR)
	cd $(SAFETY_DIR) && HYPOTHESIS_PROFILE=mutants PYTHONPATH=$(abspath $(SAFETY_DIR))/mutants \
		TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 nice -n 10 $(abspath $(BIN))/mutmut run $(MUTMUT_ARGS)
	$(BIN)/python scripts/mutants_safety.py --dest $(SAFETY_DIR) --report

venv: $(DEV_OK)

$(VENV_OK):
	$(PYTHON) -m venv $(VENV)
	touch $@

$(TORCH_OK): $(VENV_OK)
	$(PIP) install --progress-bar off $(TORCH)
	touch $@

# Editable, with the test extra (Pillow for the demo), the replay extra (transformers: the demo
# replays its last debug dump with the Qwen2-VL image processor, offline), the serve extra (the
# demo ends printing `.venv/bin/rollout-bundle serve` on its run: it must work as printed) and dev
# tools (tox, ruff, mypy). Ray lives only in tox's py311-full env: the demo does not need it.
DEV_EXTRAS := test,dev,replay,serve
$(DEV_OK): $(TORCH_OK) pyproject.toml Makefile
	$(PIP) install --progress-bar off -e '.[$(DEV_EXTRAS)]' $(TORCH)
	touch $@

# Without npm the s3rver tests skip locally (CI fails them instead); the stamp waits for npm.
$(NODE_OK): $(VENV_OK)
	@if command -v npm >/dev/null 2>&1; then \
		npm install --silent --no-audit --no-fund --prefix $(VENV)/node $(S3RVER) $(AZURITE) && touch $@; \
	else echo "make: npm not found: tests against s3rver and Azurite will be skipped (install Node.js and npm)"; fi

clean:
	rm -rf .tox build dist *.egg-info demo-out bench-out .pytest_cache .mypy_cache .ruff_cache .hypothesis mutants

distclean: clean
	rm -rf $(VENV)
