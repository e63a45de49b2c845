"""The install commands docs/trainers.md gives users, as the trainers' environment runs them.

    python tests/trainers/install_commands.py verl llamafactory swift

runs, with this interpreter's pip and in page order, every ``pip install`` line of the bash
blocks marked ``<!-- install: NAME -->`` for the names given. Two kinds of line are left to the
Makefile: torch (its CPU build is installed first, from the CPU wheel index where that answers)
and mmrope's own distributions (installed from the checkout, editable).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).parents[2] / "docs" / "trainers.md"
BLOCK = re.compile(r"<!-- install: (\w+) -->\n```bash\n(.*?)```", re.S)


def commands(page: Path = PAGE) -> dict[str, list[list[str]]]:
    """Each marked block's ``pip install`` commands as argument lists (comments and line
    continuations resolved), by the block's name."""
    found: dict[str, list[list[str]]] = {}
    for name, block in BLOCK.findall(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                assert words[:2] == ["pip", "install"], f"{name}: not a pip install line: {line}"
                found.setdefault(name, []).append(words[2:])
    return found


def left_to_the_makefile(arguments: list[str]) -> bool:
    """torch, and mmrope's own distributions."""
    packages = [word for word in arguments if not word.startswith("-") and "://" not in word]
    ours = [bool(re.match(r"(torch|mmrope-[\w-]+)\b", package)) for package in packages]
    assert all(ours) or not any(ours), f"torch and mmrope go on lines of their own: {shlex.join(arguments)}"
    return bool(packages) and all(ours)


def main(names: list[str]) -> None:
    every = commands()
    unknown = set(names) - set(every)
    if unknown:
        sys.exit(f"no install block named {sorted(unknown)} in {PAGE}; there are {sorted(every)}")
    for name in names:
        for arguments in every[name]:
            if left_to_the_makefile(arguments):
                continue
            print(f"[{name}] pip install {shlex.join(arguments)}", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", *arguments], check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
