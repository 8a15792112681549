# The whole set-up: `make run` runs the main job, `make test` runs the checks (`make lint`) and the tests.
# Both create .venv on their own if it is missing and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run lint test bench clean

$(STAMP): pyproject.toml setup.py filechannel/engine/_codec.c filechannel/engine/_readahead.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=77" wheel
	$(BIN)/python -m pip install --quiet -e '.[dev,s3,spark,bench]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python examples/pipeline.py

# mypy strict on the package (its config is in pyproject.toml), ruff's lint and format checks.
lint: $(STAMP)
	$(BIN)/mypy
	$(BIN)/ruff check filechannel tests bench
	$(BIN)/ruff format --check filechannel tests bench

test: $(STAMP) lint
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m bench --out bench/results --spark

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
