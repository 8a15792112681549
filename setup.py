"""The optional C extensions; everything else about the package is in pyproject.toml.

Optional: without a compiler the install goes on. Without ``_codec`` (or off x86-64)
filechannel.engine.record uses its pure-Python codec; without ``_readahead``, compressed
segments decompress on the reader's thread (filechannel/engine/readahead.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("filechannel.engine._codec", ["filechannel/engine/_codec.c"], optional=True, extra_compile_args=["-O2"]),
        Extension(
            "filechannel.engine._readahead",
            ["filechannel/engine/_readahead.c"],
            optional=True,
            extra_compile_args=["-O2", "-pthread"],
            extra_link_args=["-pthread"],
            libraries=["dl"],
        ),
    ]
)
