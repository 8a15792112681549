"""``python -m filechannel.bench``: the same command as ``filechannel bench``."""

from .harness import command

command.main(prog_name="python -m filechannel.bench")
