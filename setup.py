"""The optional C extension; everything else about the package is in pyproject.toml.

Optional: without a compiler (or off x86-64) the install goes on and filechannel.record
uses its pure-Python codec.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("filechannel._codec", ["filechannel/_codec.c"], optional=True, extra_compile_args=["-O2"])])
