"""Check that the text of an old README landed somewhere: in README.md or a page under docs/.

Every non-blank line of ``git show REV:README.md`` is looked for in README.md and docs/**/*.md,
as a whole line or inside one (where a sentence was extended at a seam); leading heading marks
and link targets are ignored (headings were demoted or promoted and links re-pointed when the
sections moved). Every heading is reported with where it
landed. Prints the lines found nowhere and exits 1 if there are any.

Usage: python scripts/check_readme_moved.py [REV]   (default: 3f840c4, the last 1,236-line README)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def normalise(line: str) -> str:
    line = line.strip()
    line = re.sub(r"^#+\s*", "", line)
    return re.sub(r"\]\([^)]*\)", "]()", line)


def main(rev: str = "3f840c4") -> int:
    old = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:README.md"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    where: dict[str, list[str]] = {}
    for page in pages:
        for line in page.read_text().splitlines():
            where.setdefault(normalise(line), []).append(str(page.relative_to(ROOT)))
    missing = []
    for number, line in enumerate(old, 1):
        key = normalise(line)
        if not key:
            continue
        if line.startswith("#") and not line.startswith("# or make_actuator"):
            print(f"heading {line!r} -> {', '.join(sorted(set(where.get(key, ['MISSING']))))}")
        if key not in where and not any(key in new for new in where):  # kept, words added after
            missing.append((number, line))
    for number, line in missing:
        print(f"not found: README.md:{number}: {line}")
    total = sum(1 for line in old if line.strip())
    print(f"{total - len(missing)} of {total} non-blank lines found; {len(missing)} not found")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
