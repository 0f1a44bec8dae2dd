#!/usr/bin/env python3
"""Checks the figures the chapters draw (common/plot.h), with nothing but the standard library.

  tests/check_figures.py SOURCE_ROOT
      every docs/figures/*.svg: well-formed XML, an x and a y axis label (text of class x-label
      and y-label, not empty) and at least one data series (a group of class "series" that draws
      something: a polyline with points, a dot or a cell); and the gallery docs/figures.md and
      each chapter's README show every figure of that chapter, and nothing that is not there.
  tests/check_figures.py --run FILE -- COMMAND ARG...
      runs COMMAND (which must exit 0), then checks FILE as above: a chapter's --svg run.
Exits 1 naming each file and what is wrong.
"""
import pathlib
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def problems_of(path: pathlib.Path):
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        return [f"{path}: not well-formed XML ({e})"]
    if root.tag != SVG + "svg":
        return [f"{path}: the root element is {root.tag}, not an SVG document"]
    found = []
    for label in ("x-label", "y-label"):
        texts = [el for el in root.iter(SVG + "text") if el.get("class") == label]
        if not texts or not "".join(texts[0].itertext()).strip():
            found.append(f"{path}: no {label.replace('-', ' ')} (a text element of class {label})")
    drawn = 0
    for g in root.iter(SVG + "g"):
        if g.get("class") != "series":
            continue
        lines = [p for p in g.iter(SVG + "polyline") if p.get("points", "").strip()]
        if lines or any(True for _ in g.iter(SVG + "circle")) or any(True for _ in g.iter(SVG + "rect")):
            drawn += 1
    if drawn == 0:
        found.append(f"{path}: no data series (a group of class series with points, dots or cells)")
    return found


def embedded(markdown: pathlib.Path):
    """The figures/x.svg images a markdown page shows."""
    text = markdown.read_text(encoding="utf-8")
    return set(re.findall(r"!\[[^\]]*\]\((?:\.\./)*(?:docs/)?figures/([^)/]+\.svg)\)", text))


def check_tree(root: pathlib.Path):
    figures = root / "docs" / "figures"
    svgs = sorted(figures.glob("*.svg"))
    if not svgs:
        return [f"{figures}: no figures (make figures draws them)"]
    found = []
    for svg in svgs:
        found += problems_of(svg)
    names = {p.name for p in svgs}
    gallery = root / "docs" / "figures.md"
    shown = embedded(gallery) if gallery.exists() else set()
    for name in sorted(names - shown):
        found.append(f"{gallery}: does not show {name}")
    for name in sorted(shown - names):
        found.append(f"{gallery}: shows {name}, which docs/figures does not hold")
    for readme in sorted(root.glob("chapters/[0-9][0-9]_*/README.md")):
        chapter = "ch" + readme.parent.name[:2]
        own = {n for n in names if n.startswith(chapter + "-")}
        shows = embedded(readme)
        for name in sorted(own - shows):
            found.append(f"{readme}: does not show its figure {name}")
        for name in sorted(shows - names):
            found.append(f"{readme}: shows {name}, which docs/figures does not hold")
    return found


def main():
    args = sys.argv[1:]
    if len(args) >= 4 and args[0] == "--run" and args[2] == "--":
        out = pathlib.Path(args[1])
        out.unlink(missing_ok=True)
        run = subprocess.run(args[3:])
        if run.returncode != 0:
            sys.exit(f"check_figures: {' '.join(args[3:])} exited with {run.returncode}")
        found = problems_of(out)
        count = 1
    elif len(args) == 1:
        found = check_tree(pathlib.Path(args[0]))
        count = len(list((pathlib.Path(args[0]) / "docs" / "figures").glob("*.svg")))
    else:
        sys.exit(__doc__)
    for p in found:
        print("check_figures:", p, file=sys.stderr)
    if found:
        sys.exit(f"check_figures: {len(found)} problems")
    print(f"check_figures: {count} figure(s) well-formed, with both axis labels and a data series")


if __name__ == "__main__":
    main()
