"""``python -m opdvfs.datasets [NAME]``: print a bundled dataset's path, or list them."""

import sys

from opdvfs.datasets import DATASETS, dataset_path

if len(sys.argv) == 2:
    try:
        print(dataset_path(sys.argv[1]))
    except KeyError as exc:
        print(f"opdvfs.datasets: {exc.args[0]}", file=sys.stderr)
        sys.exit(2)
else:
    for key, (_, text) in DATASETS.items():
        print(f"{key:26s} {text}")
