"""Benchmark harness for filechannel: our APIs against peer disk queues and the Python floor.

Run it with ``python -m bench`` (``--quick`` for a CI-sized run); see :mod:`bench.__main__`.
"""
