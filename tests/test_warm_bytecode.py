"""The suite's warm-up writes the cached rewrite that pytest's own import reads (tests/warm_bytecode.py)."""

import sys

import pytest
from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc

from . import warm_bytecode


def test_the_warm_up_caches_the_rewritten_module_once(pytestconfig: pytest.Config, tmp_path, monkeypatch):
    source = tmp_path / "test_warmed.py"
    source.write_text("def test_it():\n    x = 1\n    assert x == 2\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    warm_bytecode._rewrite(pytestconfig, [source])
    cached = tmp_path / "__pycache__" / ("test_warmed" + PYC_TAIL)
    written = cached.stat().st_mtime_ns
    # what pytest's import hook reads before it would rewrite the module itself: the rewritten asserts
    code = _read_pyc(source, cached)
    assert code is not None
    namespace: dict = {}
    exec(code, namespace)
    with pytest.raises(AssertionError, match=r"assert 1 == 2"):
        namespace["test_it"]()
    # a cache that is up to date is left as it is
    warm_bytecode._rewrite(pytestconfig, [source])
    assert cached.stat().st_mtime_ns == written
