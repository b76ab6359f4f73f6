# The two commands: `make demo` runs the main job on the embedded default, `make test` the tests.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
MXQ := $(BIN)/mxq

.PHONY: venv demo test lint down clean

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

test: venv
	$(BIN)/ruff check .
	$(BIN)/pytest

lint: venv
	$(BIN)/ruff check .

down:
	$(MXQ) down

clean: down
	rm -rf var
