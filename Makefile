# Two commands matter: `make demo` (the embedded demo) and `make test` (everything CI runs).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo needs only the package and uvicorn (the server extra), not the dev extra's
# linters, databases' drivers and docs tools: a fresh clone's `make demo` installs that alone.
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test check lint types unit docs dist browser screenshots reliability fuzz-long histories-long soak bench bench-quick bench-reads bench-scale clean

$(STAMP): pyproject.toml agentfn_asgi/_version.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml agentfn_asgi/_version.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[server]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/agentfn-asgi demo

lint: $(STAMP)
	$(BIN)/ruff check agentfn_asgi pytest_agentfn.py tests examples benchmarks docs_hooks
	$(BIN)/ruff format --check agentfn_asgi pytest_agentfn.py tests examples benchmarks docs_hooks

types: $(STAMP)
	$(BIN)/mypy

# The suite on WORKERS pytest-xdist processes (-n): about 8.5 minutes of wall time on a 2-core
# machine instead of about 13 in one process (it waits on sleeps, leases and subprocesses more
# than it computes). Workers keep apart by names of their own, and the tests that bound a wall
# time (marked exclusive) run while no other test does: see tests/conftest.py. WORKERS=0 runs
# everything in one process. Not more by default: at 4 on 2 cores (7.7 min) a restarted app
# missed the crash matrix's 5 s redelivery window once.
WORKERS ?= 2

unit: $(STAMP) browser
	$(BIN)/pytest -q -n $(WORKERS)

# The operator page's browser tests drive Debian's chromium + chromium-driver: installed here
# when missing and when we are root (or have passwordless sudo); elsewhere they skip.
browser:
	@bash .ci/install-browser

# Photograph each operator page into docs/screenshots/ (shown in the README).
screenshots: $(STAMP) browser
	$(BIN)/python -m tests.admin.screenshots docs/screenshots

# The documentation site (docs/, mkdocs.yml) into site/; --strict turns every warning (a broken
# link, a docstring mkdocstrings cannot read) into a failure.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The sdist and the wheel a release publishes, into dist/ (git-ignored): built from the sdist,
# as an installer would, and checked by twine (metadata complete, the README renders).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/twine check --strict dist/*

test: lint types docs dist unit

# The fast subset while coding (about half a minute of CPU, 50 s on two workers instead of 70 s
# in one): no process spawned, no backend service, no property tests.
check: $(STAMP)
	$(BIN)/pytest -q -x -n $(WORKERS) -m "not slow and not reliability and not backends and not hypothesis"

reliability: $(STAMP)
	$(BIN)/pytest -q -m reliability

# The long hostile-input profile: many more hypothesis examples than `make test` runs.
fuzz-long: $(STAMP)
	AGENTFN_FUZZ_EXAMPLES=5000 $(BIN)/pytest -q -m reliability tests/test_fuzz_webhook.py

# The long profile of the generated store histories: ten times the examples of `make test`
# (new ones on every run), on every backend (Redis and PostgreSQL must be running).
histories-long: $(STAMP)
	AGENTFN_HISTORY_EXAMPLES=2000 $(BIN)/pytest -q tests/store/test_histories.py

# The randomized fault soak (not part of `make test`, which runs a one-minute one): three
# replicas of the Starlette example on SOAK_STORE (postgres, redis or sqlite; default redis)
# for SOAK_SECONDS (default 600) under a nemesis seeded by SOAK_SEED (printed; give it again
# to replay the same faults). Prints one final line; exits non-zero on any violation.
soak: $(STAMP)
	$(BIN)/python -m tests.soak

# The full matrix, then what flow control's limits cost when never reached (target <= 1.10x).
bench: $(STAMP)
	$(BIN)/python -m benchmarks.run
	$(BIN)/python -m benchmarks.limits_cost

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --quick

# The operator's reads over a store of 10^6 calls (SQLite, PostgreSQL; Redis 10^5), and
# webhook acks while the page is read every second: about 10 minutes, mostly filling.
bench-reads: $(STAMP)
	$(BIN)/python -m benchmarks.page_reads

# Cost that does not grow, four curves in turn, one table each (not part of `make test`;
# PostgreSQL and Redis must be running): CPU per call against stored calls (10^3..10^6,
# Redis to 10^5), starts per second against line length (benchmarks.waiting_line), ack
# latency while the page is read at 10^6 stored calls (benchmarks.page_reads), and the time
# to answer a healthy session behind 0, 100 and 1,000 failing deliveries. About 40 minutes,
# mostly filling stores. `python -m benchmarks.scale --curve line` runs one curve.
bench-scale: $(STAMP)
	$(BIN)/python -m benchmarks.scale

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build dist site *.egg-info
