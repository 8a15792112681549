"""``python -m filechannel.cli``: the console script."""

from . import main

main()
