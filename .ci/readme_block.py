"""Print the shell command of README.md's code block marked ``<!-- ci: NAME -->`` (stdlib only).

CI runs README's Quickstart commands *as printed*: it reads them from README.md with this script
instead of keeping its own copy, so the README and CI can never drift apart.
Usage: ``python3 .ci/readme_block.py quickstart-train``.
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def block(name: str, text: str) -> str:
    lines = text.splitlines()
    marker = f"<!-- ci: {name} -->"
    for i, line in enumerate(lines):
        if line.strip() == marker:
            start = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
            return "\n".join(lines[start + 1 : end]).strip()
    raise SystemExit(f"README.md has no block marked {marker}")


if __name__ == "__main__":
    print(block(sys.argv[1], README.read_text()))
