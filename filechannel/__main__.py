"""``python -m filechannel``: the ``filechannel`` command."""

from .cli import main

main()
