"""Print the pinned requirements of pyproject.toml, one a line, for an image's dependency layer.

The images install dependencies from this list before copying the source, so that a code change does not
reinstall them. The GPU image swaps `onnxruntime` for `onnxruntime-gpu` here, the one place both images
read their pins from.

    python3 requirements.py pyproject.toml                          # serving dependencies only
    python3 requirements.py pyproject.toml --extra optimize --skip torch
    python3 requirements.py pyproject.toml --replace onnxruntime=onnxruntime-gpu==1.31.1 \
        --add tensorrt-cu13-libs==10.16.1.11

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(requirement: str) -> str:
    """The normalized project name of a requirement string (PEP 503: lower case, runs of -_. as -)."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(
    pyproject: dict[str, object],
    extras: Sequence[str] = (),
    skip: Sequence[str] = (),
    replace: dict[str, str] | None = None,
    add: Sequence[str] = (),
) -> list[str]:
    """The base dependencies plus those of `extras` (self-references dropped), minus `skip`, with
    `replace` mapping a project name to the requirement that stands in for it ("" drops it), plus `add`."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    own = requirement_name(project["name"])
    optional = project.get("optional-dependencies", {})
    found = list(project.get("dependencies", []))
    for extra in extras:
        if extra not in optional:
            raise KeyError(f"pyproject.toml has no extra {extra!r}; it has {', '.join(optional)}")
        found += optional[extra]
    found += [a for a in add if a]
    replace = {requirement_name(k): v for k, v in (replace or {}).items()}
    dropped = {requirement_name(s) for s in skip} | {own}
    lines: list[str] = []
    for req in found:
        name = requirement_name(req)
        if name in dropped:
            continue
        req = replace.get(name, req)
        if req and req not in lines:
            lines.append(req)
    return lines


def _pair(text: str) -> tuple[str, str]:
    name, sep, req = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=REQUIREMENT, got {text!r}")
    return name, req


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("--extra", action="append", default=[], help="an optional-dependencies group to add")
    parser.add_argument("--skip", action="append", default=[], help="a project to leave out")
    parser.add_argument("--replace", action="append", type=_pair, default=[], help="NAME=REQUIREMENT")
    parser.add_argument("--add", action="append", default=[], help="a requirement to add (empty: none)")
    args = parser.parse_args(argv)
    data = tomllib.loads(args.pyproject.read_text())
    for line in requirements(data, args.extra, args.skip, dict(args.replace), args.add):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
