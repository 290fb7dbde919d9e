# Two entry points: `make demo` and `make test`. Both set up .venv from scratch if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU wheel of torch, pinned for development and CI (the package itself asks only torch>=2.1).
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test setup lint docs typecheck package-check clean bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks tools

# The documentation site (mkdocs.yml) into site/; --strict: a broken link, anchor or API reference fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# mypy on src/torchrepro, configured in pyproject.toml (strict on the public API).
typecheck: $(STAMP)
	$(BIN)/python -m mypy

# Build the sdist and wheel, twine check, install the wheel into a fresh venv and smoke-test it (tools/package_check.py).
package-check: $(STAMP)
	$(BIN)/python tools/package_check.py --torch-pin "$(TORCH_PIN)"

# The suite on PYTEST_WORKERS processes (pytest-xdist; 0 = one process). Its tests mostly wait on the training
# processes they start, one core at a time: on 2 cores two workers ran it in about half the time. --dist loadgroup
# (with tests/conftest.py's scheduler) keeps each module that builds a module-scoped fixture on one worker.
PYTEST_WORKERS ?= 2

# compileall first: where PYTHONDONTWRITEBYTECODE is set, no process writes the bytecode of torchrepro and the tests,
# and each of the suite's ~700 training processes would compile the modules it imports again (~0.1 CPU s each).
test: lint docs typecheck package-check
	$(BIN)/python -m compileall -q -x lint_fixtures src tests tools benchmarks examples >/dev/null
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=25 --cpu-top 25

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_fingerprint.py
	$(BIN)/python benchmarks/bench_record_overhead.py
	$(BIN)/python benchmarks/bench_optrace.py
	$(BIN)/python benchmarks/bench_tracer_start.py
	$(BIN)/python benchmarks/bench_check_wall.py
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_lint.py
	$(BIN)/python benchmarks/bench_consistency.py
	$(BIN)/python benchmarks/bench_measure.py
	$(BIN)/python benchmarks/bench_nn_alternatives.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis demo-out site build dist src/torchrepro.egg-info

# The one prepared GPU check (tools/gpu_check.py; docs/development.md, "When a GPU is lent"). No $(STAMP): the lent
# GPU machine reaches no package registry, and its python3 already holds a CUDA torch; torchrepro is imported from
# src/. GPU_PY: the venv's python when there is one, else python3. GPU_CHECK_ARGS=--dry-run runs it on the CPU.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_CHECK_ARGS ?=

.PHONY: gpu-check
gpu-check:
	$(GPU_PY) tools/gpu_check.py $(GPU_CHECK_ARGS)
