# The whole set-up: `make run` runs the main job, `make test` runs the checks (`make lint`) and the tests.
# Both create .venv on their own if it is missing and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# What is kept between checkouts of this user, out of the checkout: the locked dependencies as wheels
# and as a compiled venv that a checkout's venv is a copy of in hard links (make/venv.sh), mypy's
# cache, the HDFS tests' Hadoop jars.
CACHE  := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/filechannel
EXTRAS := .[dev,s3,hdfs,spark,bench]

.PHONY: run lint test bench lock clean

$(STAMP): pyproject.toml constraints.txt setup.py filechannel/engine/_codec.c filechannel/engine/_readahead.c make/venv.sh
	bash make/venv.sh $(PYTHON) $(VENV) $(CACHE) '$(EXTRAS)'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python examples/pipeline.py

# mypy (strict on the package; the tests too, their annotations optional), the import layers of
# DESIGN.md "Layers" (lint-imports), ruff's lint and format checks; their configuration is in pyproject.toml.
# mypy's cache is kept out of the checkout, shared by every checkout of this user: a fresh clone
# checks again only the files whose contents differ (mypy compares each file's hash with its cache's).
lint: $(STAMP)
	MYPY_CACHE_DIR=$(CACHE)/mypy $(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check filechannel tests
	$(BIN)/ruff format --check filechannel tests

# Two pytest-xdist workers per CPU and no more: the suite waits on JVMs, servers and subprocesses,
# so one worker per CPU left the CPUs idle a third of the time, and three workers on two CPUs took
# longer than four (measured with the groups of tests/conftest.py in effect, which
# tests/test_grouping.py checks). The tests of the session's Spark share one worker and its one
# Spark session, those of the one HDFS another.
WORKERS := $(shell $(PYTHON) -c "import os; print(2 * (os.cpu_count() or 1))")
# Bytecode is written (.gitignore'd __pycache__) even where PYTHONDONTWRITEBYTECODE is set, as on
# this VM: without it every one of the suite's thousand-odd Python processes compiled the modules
# it imports, and each worker compiled every test module again, in collection and in all.
test: $(STAMP) lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup

bench: $(STAMP)
	$(BIN)/python -m filechannel.bench --out bench/results --spark

# Lock the newest versions pyproject.toml allows: a fresh venv, an unconstrained install, its freeze.
lock:
	rm -rf build/lock-venv
	$(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/python -m pip install --quiet --upgrade pip "setuptools>=77" wheel
	build/lock-venv/bin/python -m pip install --quiet -e '$(EXTRAS)'
	{ sed -n '/^#/p' constraints.txt; build/lock-venv/bin/python -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf build/lock-venv

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
