"""The package as a user meets it: every error importable from the top, typed, licensed."""

import importlib.resources
import inspect
from pathlib import Path

import filechannel
from filechannel import errors

ROOT = Path(__file__).resolve().parents[1]


def test_every_error_a_user_may_catch_is_importable_from_filechannel():
    ours = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.FileChannelError)]
    assert len(ours) > 20
    for cls in ours:
        assert getattr(filechannel, cls.__name__) is cls, cls.__name__
        assert cls.__name__ in filechannel.__all__


def test_the_package_is_marked_typed_and_licensed():
    assert importlib.resources.files("filechannel").joinpath("py.typed").is_file()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject and 'license-files = ["LICENSE"]' in pyproject
    assert 'filechannel = ["py.typed"]' in pyproject
