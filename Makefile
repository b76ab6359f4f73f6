# The two commands: `make demo` runs the main job on the embedded default, `make test` the tests.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
MXQ := $(BIN)/mxq

.PHONY: venv demo test lint down clean browser

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cpu,test]'
	touch $@

demo: venv
	$(MXQ) up --detach
	@for d in $$($(MXQ) devices --json | $(BIN)/python -c 'import json,sys; print(" ".join(r["device"] for r in json.load(sys.stdin) if r["alive"]))'); do \
		$(MXQ) probe --device $$d --wait || exit 1; \
	done
	$(MXQ) demo
	$(MXQ) devices
	$(MXQ) jobs
	@echo "The stack is still up: '$(MXQ) down' stops it."

test: venv browser
	$(BIN)/ruff check .
	$(BIN)/pytest

# The dashboard test drives Debian's Chromium; installed here when missing and we are root.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); } || \
		echo "chromium is not installed: the dashboard test will skip (and fail where CI is set)"

lint: venv
	$(BIN)/ruff check .

down:
	$(MXQ) down

clean: down
	rm -rf var
