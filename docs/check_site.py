#!/usr/bin/env python3
"""Checks the rendered Doxygen site against the markdown it was made from: what a reader copies
from a page must be what the page's source says.

  docs/check_site.py SOURCE_ROOT HTML_DIR

For every markdown page of the site (README.md is the main page, index.html; any other x/y.md
is md_x_y.html):
  - every fenced code block of the source is a code fragment of the page, line for line, in
    order (the labs' "Test:" commands are such blocks, so each is checked to copy intact);
  - on the main page, docs/labs.md and the Lab section of each chapter README (what a student
    reads and copies from): every inline code span of the source is a <code> element of the page
    with the same text (whitespace runs count as one space: a span may wrap in the source), and
    the text outside code shows no markdown that failed to render: no backtick, no **.
And no source page (x_source.html) shows an exercise's reference lines: the sources reach the
site through tools/lab.sh filter, which leaves each region as its stub.
Exits 1 naming each page and what differs.
"""
import html
import html.parser
import pathlib
import re
import sys

FENCE = re.compile(r"^([ \t]*)(```+|~~~+)[^\n]*\n(.*?)^[ \t]*\2[ \t]*$", re.M | re.S)
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
# Doxygen's FILTER_PATTERNS for *.md (docs/Doxyfile.in) rewrites image paths only; code is untouched.


def page_name(rel: str) -> str:
    if rel == "README.md":
        return "index.html"
    return "md_" + re.sub(r"[^A-Za-z0-9]", "_", rel[: -len(".md")]) + ".html"


def squash(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def source_code(text: str):
    """The fenced blocks (dedented, as line lists) and the inline spans outside them."""
    blocks = []
    for m in FENCE.finditer(text):
        indent = len(m.group(1))
        lines = [ln[indent:] if ln[:indent].strip() == "" else ln.lstrip() for ln in m.group(3).split("\n")]
        if lines and lines[-1] == "":
            lines.pop()
        # Doxygen draws a block without the indentation its lines have in common.
        common = min((len(ln) - len(ln.lstrip(" ")) for ln in lines if ln.strip()), default=0)
        blocks.append([ln[common:] for ln in lines])
    rest = FENCE.sub("", text)
    rest = re.sub(r"<!--.*?-->", "", rest, flags=re.S)
    # Indented code blocks (four spaces after a blank line, outside lists) hold no spans; the
    # pages here use fences, so only spans are looked for.
    spans = [squash(m.group(2)) for m in SPAN.finditer(rest)]
    return blocks, [s for s in spans if s]


class Page(html.parser.HTMLParser):
    """The code fragments (line lists), the <code> texts and the plain text of a Doxygen page's contents."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fragments, self.codes, self.text = [], [], []
        self.depth = 0  # inside <div class="contents">
        self.frag = None  # lines of the fragment being read
        self.line = None
        self.code = None
        self.divs = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "") or ""
        if tag == "div":
            kind = "other"
            if cls == "contents":
                kind = "contents"
                self.depth += 1
            elif cls == "fragment":
                kind = "fragment"
                self.frag = []
            elif cls == "line" and self.frag is not None:
                kind = "line"
                self.line = []
            self.divs.append(kind)
        elif tag == "code" and self.frag is None:
            self.code = []

    def handle_endtag(self, tag):
        if tag == "div" and self.divs:
            kind = self.divs.pop()
            if kind == "contents":
                self.depth -= 1
            elif kind == "line" and self.frag is not None:
                self.frag.append("".join(self.line))
                self.line = None
            elif kind == "fragment":
                self.fragments.append(self.frag)
                self.frag = None
        elif tag == "code" and self.code is not None:
            self.codes.append(squash("".join(self.code)))
            self.code = None

    def handle_data(self, data):
        if self.line is not None:
            self.line.append(data)
        elif self.code is not None:
            self.code.append(data)
        elif self.depth > 0 and self.frag is None:
            self.text.append(data)


def lab_section(source: str, page: str, rel: str):
    """A chapter README's "## Lab" section, in the source and in the rendered page (Doxygen
    draws a ## heading as <h1> on a page whose title is the # heading)."""
    m = re.search(r"^## Lab[ \t]*\n(.*?)(?=^## |\Z)", source, re.M | re.S)
    h = re.search(r"<h1>(?:<a [^>]*></a>)?\s*Lab</h1>(.*?)(?=<h1|</div><!-- contents -->)", page, re.S)
    if not m or not h:
        return None
    return m.group(1), '<div class="contents">' + h.group(1) + "</div>"


def check_page(src: pathlib.Path, rel: str, html_dir: pathlib.Path, strict: bool):
    out = html_dir / page_name(rel)
    if not out.exists():
        return [f"{rel}: no rendered page {out.name}"]
    source, page = src.read_text(encoding="utf-8"), out.read_text(encoding="utf-8")
    blocks, _ = source_code(source)
    p = Page()
    p.feed(page)
    problems = []
    # Doxygen draws a fragment's line numbers and links as markup inside the line; the text is
    # what a reader copies. A trailing blank line of a block is not drawn.
    frags = [[ln.replace("\u00a0", " ").rstrip() for ln in f] for f in p.fragments]
    frags = [f[:-1] if f and f[-1] == "" else f for f in frags]
    want = [[ln.rstrip() for ln in b] for b in blocks]
    for i, b in enumerate(want):
        got = frags[i] if i < len(frags) else None
        if got != b:
            problems.append(f"{rel}: code block {i + 1} renders as {got!r}, its source is {b!r}")
    if len(frags) > len(want):
        problems.append(f"{rel}: {len(frags)} code fragments rendered, {len(want)} in the source")
    if not strict:
        return problems
    if rel.startswith("chapters/"):
        lab = lab_section(source, page, rel)
        if lab is None:
            return problems + [f"{rel}: no Lab section found in the source or the page"]
        source, page = lab
    _, spans = source_code(source)
    p = Page()
    p.feed(page)
    codes = {}
    for c in p.codes:
        codes[c] = codes.get(c, 0) + 1
    for s in spans:
        if codes.get(s, 0) > 0:
            codes[s] -= 1
        else:
            problems.append(f"{rel}: the code span `{s}` does not render as code with that text")
    text = "".join(p.text)
    for mark in ("`", "**"):
        for m in re.finditer(re.escape(mark), text):
            ctx = squash(text[max(0, m.start() - 40): m.end() + 40])
            problems.append(f"{rel}: a literal {mark} in the page's text: ...{ctx}...")
    return problems


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root, html_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    pages = ["README.md", "tools/README.md"]
    for d in ("docs", "chapters", "data/models"):
        pages += sorted(str(p.relative_to(root)) for p in (root / d).rglob("*.md"))
    problems = []
    for rel in pages:
        strict = rel in ("README.md", "docs/labs.md") or re.fullmatch(r"chapters/\d\d_[^/]+/README\.md", rel) is not None
        problems += check_page(root / rel, rel, html_dir, strict)
    sources = sorted(html_dir.glob("*_source.html"))
    stubs = set()
    for page in sources:
        # A source line's text: its line number, then the code (a region's marker is a comment
        # line of its own; lab.h's documentation quotes one inside a /// comment, which is not).
        for raw in re.findall(r'<div class="line">(.*?)</div>', page.read_text(encoding="utf-8")):
            line = re.sub(r"^\s*\d+", "", html.unescape(re.sub(r"<[^>]*>", "", raw)))
            m = re.match(r"\s*// EXERCISE (\d\d\.\d+) (BEGIN|STUB|END)", line)
            if m:
                problems.append(f"{page.name}: shows exercise {m.group(1)}'s {m.group(2)} line: the solution is on the site")
            m = re.match(r"\s*// EXERCISE (\d\d\.\d+): .*\(replace the stub below\)$", line)
            if m:
                stubs.add(m.group(1))
    if not sources:
        problems.append("no source pages (SOURCE_BROWSER)")
    elif not stubs:
        problems.append("no source page shows an exercise's stub: is tools/lab.sh filter in FILTER_PATTERNS?")
    for p in problems:
        print("check_site:", p, file=sys.stderr)
    if problems:
        sys.exit(f"check_site: {len(problems)} problems in the rendered site (docs/check_site.py)")
    print(f"check_site: {len(pages)} pages: every code block renders as its source; on the main page, "
          "docs/labs.md and the chapters' Lab sections every code span too, and no markdown is left raw; "
          f"{len(sources)} source pages show {len(stubs)} exercises as stubs and no solution")


if __name__ == "__main__":
    main()
