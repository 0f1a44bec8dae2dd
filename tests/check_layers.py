#!/usr/bin/env python3
"""The project's one architecture rule (docs/architecture.md), checked on the sources.

A chapter builds on the chapters before it and on common/: no file of chapters/NN_* includes a
header of chapters/MM_* with MM > NN, and no chapter's CMakeLists.txt links chMM_lib with MM > NN.
common/ includes no chapter and links no chapter's library. Tests of a chapter (tests/chNN/) follow
the chapter's rule. Prints each breach as file:line and exits 1; prints the counts it checked and
exits 0 when there is none.

usage: check_layers.py ROOT
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"chapters/(\d\d)_[^/"]+/')
LINK = re.compile(r'\bch(\d\d)_lib\b')
SOURCES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}


def layer_of(rel: pathlib.PurePosixPath):
    """The chapter number a file belongs to, 'common' for common/, None for the rest."""
    parts = rel.parts
    if parts[0] == "common":
        return "common"
    if parts[0] == "chapters" and len(parts) > 1 and re.match(r"\d\d_", parts[1]):
        return int(parts[1][:2])
    if parts[0] == "tests" and len(parts) > 1 and re.fullmatch(r"ch\d\d", parts[1]):
        return int(parts[1][2:])
    return None


def breach(layer, other):
    return layer == "common" or other > layer


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1])
    problems, files, edges = [], 0, 0
    for top in ("common", "chapters", "tests"):
        for path in sorted((root / top).rglob("*")):
            if not path.is_file():
                continue
            rel = pathlib.PurePosixPath(path.relative_to(root).as_posix())
            layer = layer_of(rel)
            if layer is None:
                continue
            is_cmake = path.name == "CMakeLists.txt"
            if path.suffix not in SOURCES and not is_cmake:
                continue
            files += 1
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                found = [int(m.group(1)) for m in LINK.finditer(line.split("#")[0])] if is_cmake else []
                m = INCLUDE.match(line) if not is_cmake else None
                if m:
                    found.append(int(m.group(1)))
                for other in found:
                    edges += 1
                    if other != layer and breach(layer, other):
                        what = "links ch%02d_lib" % other if is_cmake else "includes chapter %02d" % other
                        whose = "common/" if layer == "common" else "chapter %02d" % layer
                        problems.append("%s:%d: %s %s (%s)" % (rel, n, whose, what, line.strip()))
    for p in problems:
        print(p)
    if problems:
        print("check_layers: %d breaches of the rule (a chapter builds on earlier chapters and common/; "
              "common/ on no chapter): move the code into common/ or into the later chapter" % len(problems))
        return 1
    print("check_layers: %d files, %d references to chapters, none forward and none from common/" % (files, edges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
