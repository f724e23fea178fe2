"""Import every real measurement file under ../shared/data/real and print what came out.

Not part of the test suite (a user's clone has no ../shared). Prints one row per file: format,
operators, clocks, rows, rows dropped, and the error line for files opdvfs refuses.

    .venv/bin/python benchmarks/real_data_import.py [--root ../shared/data/real]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from opdvfs import InputFormatError
from opdvfs.io import read_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("../shared/data/real"))
    args = parser.parse_args()
    files = sorted(
        p
        for p in args.root.rglob("*.csv")
        if "guerreiro" not in p.parts[-2] and "zeus-nsdi23" not in p.parts[-2]
    )
    print(f"{'file':62s} {'format':15s} {'ops':>5s} {'clocks':>6s} {'rows':>6s} {'ms':>6s}")
    for path in files:
        t0 = time.perf_counter()
        try:
            p = read_profile(path)
        except InputFormatError as exc:
            print(f"{path.relative_to(args.root)!s:62s} refused: {str(exc).split(': ', 1)[1]}")
            continue
        ms = (time.perf_counter() - t0) * 1e3
        print(
            f"{path.relative_to(args.root)!s:62s} {p.meta['format']:15s} {p.n_ops:5d} "
            f"{len(p.freqs_mhz):6d} {len(p):6d} {ms:6.0f}"
        )


if __name__ == "__main__":
    main()
