"""Benchmark harness for filechannel: our APIs against peer disk queues and the Python floor.

Run it with ``filechannel bench`` or ``python -m filechannel.bench`` (``--quick`` for a
CI-sized run, ``--help`` for the options); see :mod:`filechannel.bench.harness`. The
package itself never imports it (only the CLI's ``bench`` command, when it runs).
"""
