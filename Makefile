# The two commands: `make demo` runs the main job on the embedded default, `make test` the fast
# tier of the tests (embedded leg, no `slow` tests). `make test-all` runs every test on both legs.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
MXQ := $(BIN)/mxq

.PHONY: venv demo test test-fast test-all test-gpu-install bench lint docs down clean browser prometheus compose

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cpu,test]'
	touch $@

demo: venv
	$(MXQ) up --detach
	$(MXQ) demo
	$(MXQ) devices
	@echo "The stack is still up: '$(MXQ) down' stops it."

# The lint runs beside the fast tier (make -j2: mypy takes a core while the tests mostly wait on
# their workers), which saves its half minute; its few lines land among the tests' dots.
test: venv compose
	@$(MAKE) --no-print-directory -j2 lint test-fast

# Two sessions beside each other (pytest-xdist): most tests wait on their workers, so the second
# session fills the waits. Each test goes to whichever session is free (`--dist load`): grouping
# each file in one session (loadgroup) made the fast tier of CI 8 min 11 s instead of 5 min 42 s,
# its big files run whole on one side. So no test may rely on another having run before it.
XDIST := -n 2 --dist load
test-fast: venv
	$(BIN)/pytest $(XDIST) -m "not slow and not gpu_install" --legs embedded

# CI: the slow tier too (fault suite, SIGKILL, multi-node, out-of-memory, bench, browser, load), and
# the tests marked both_legs on Redis + PostgreSQL as well; the slowest tests of each part listed.
# Both tiers run in two sessions, as `make test`: the slow tier used under half of two cores in one
# (it waits on restarts, outages and its workers).
test-all: venv browser prometheus compose lint
	$(BIN)/pytest $(XDIST) -m "not slow and not gpu_install" --legs both --durations=10
	$(BIN)/pytest $(XDIST) -m "slow and not gpu_install" --legs both --durations=25

# The benchmarks at their full sizes, the figures to judge by (docs/benchmarks.md), into var/bench;
# CI runs them only at their quick sizes, as smoke tests of the slow tier (tests/benchmarks/).
bench: venv
	$(BIN)/python -m bench --out var/bench

# The gpu extra installed for real on a host without a GPU: .venv-gpu (mxnet-cu112 and the
# nvidia-*-cu11 wheels, 4.3 GB installed) and the driver's libcuda.so.1 from Debian's libcuda1 (non-free),
# unpacked under var/tools; tests/hosts/test_gpu_install.py runs mxq from that venv. CI runs it.
# The gpu-onnx extra the same way, alone (a host with only GPUs MXNet cannot run): .venv-gpu-onnx
# holds onnxruntime-gpu and the nvidia-*-cu12 wheels (3.8 GB installed) and no MXNet. Never one
# venv for both: their NVIDIA wheels own some of the same files (tests/hosts/test_mixed_gpu_install.py).
GPU_VENV := .venv-gpu
GPU_ONNX_VENV := .venv-gpu-onnx
LIBCUDA := var/tools/libcuda/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1
test-gpu-install: venv $(GPU_VENV)/.installed $(GPU_ONNX_VENV)/.installed $(LIBCUDA)
	$(BIN)/pytest -m gpu_install --durations=10

$(GPU_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(GPU_VENV)/bin/python -m pip install --quiet -e '.[gpu]'
	touch $@

$(GPU_ONNX_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(GPU_ONNX_VENV)
	$(GPU_ONNX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(GPU_ONNX_VENV)/bin/python -m pip install --quiet -e '.[gpu-onnx]'
	touch $@

$(LIBCUDA):
	tools/fetch-deb var/tools/libcuda bookworm non-free libcuda1

# The dashboard test (slow tier) drives Debian's Chromium; installed here when missing and we are root.
# Debian's prometheus (and promtool) for tests/api/test_prometheus.py, as root where apt-get is.
prometheus:
	@command -v prometheus >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null); } || \
		echo "prometheus is not installed: the Prometheus test will skip (and fail where CI is set)"

browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); } || \
		echo "chromium is not installed: the dashboard test will skip (and fail where CI is set)"

# ruff, then the type checker and import-linter's layer contracts (pyproject.toml), both run on
# var/view/mxq: the package as one folder of links (tools/package_view.py), which they can walk.
# mypy also checks tests/ and bench/ (pyproject.toml's floor: not strict, but the bodies of
# unannotated functions checked), from the repository root with MYPYPATH=var/view: they import
# `mxq` through the editable install, whose import hook mypy cannot follow, so it reads the view.
# Last, the documentation site, built strictly (see `docs` below).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/python tools/package_view.py var/view >/dev/null
	cd var/view && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p mxq
	MYPYPATH=var/view $(BIN)/mypy --config-file pyproject.toml --cache-dir var/mypy-tests tests bench
	cd var/view && PYTHONPATH=. ../../$(BIN)/lint-imports --no-cache ../../pyproject.toml
	$(MKDOCS) build --strict --quiet

# The documentation site (mkdocs.yml, docs/) into var/site; `make lint` builds it with --strict (a
# broken link, a page left out of the nav fails it). Its CLI and HTTP references are generated from
# the code as it builds (docs/reference_pages.py). `$(BIN)/mkdocs serve` serves it live while you edit.
# (NO_MKDOCS_2_WARNING: Material for MkDocs' banner about MkDocs 2.0, printed on every build.)
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
docs: venv
	$(MKDOCS) build --strict

down:
	$(MXQ) down

clean: down
	rm -rf var

# Compose v2 (Debian trixie's docker-compose package: its `config` runs without a Docker engine)
# checks docker-compose.yml in the tests; fetched into var/tools without installing anything.
COMPOSE := var/tools/compose/usr/libexec/docker/cli-plugins/docker-compose
compose: $(COMPOSE)
$(COMPOSE):
	@command -v apt-get >/dev/null && tools/fetch-deb var/tools/compose trixie main docker-compose || \
		echo "could not fetch Compose v2: the compose tests will skip (and fail where CI is set)"
