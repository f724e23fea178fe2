"""``python -m opdvfs``: the command line (``torchrun -m opdvfs run ...`` uses this)."""

from opdvfs.cli import main

main()
