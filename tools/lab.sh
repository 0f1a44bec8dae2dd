#!/usr/bin/env bash
# The course labs (docs/labs.md): exercise regions in the reference code, the student tree made
# from them, and the checks and grades built on the ctest labels of tests/lab_tests.txt.
#
#   tools/lab.sh list                 every exercise: id, file:line, title
#   tools/lab.sh student DEST         write the student tree: each region replaced by its stub
#   tools/lab.sh check                write and build the student tree in build/lab/student, and
#                                     check that exactly the exercise tests fail, each with its
#                                     "not done yet" message (CI runs this: make lab-check)
#   tools/lab.sh grade [BUILD] [XML]  run the exercise tests, print a score per exercise and
#                                     write a JUnit XML report (default build/release, lab.xml)
#   tools/lab.sh relabel              rebuild tests/lab_tests.txt: build a trace tree, run every
#                                     test, record which exercises each one reaches
#
# A region, in a C++ source file (host code only), inside a function body:
#   // EXERCISE 02.1 BEGIN: title
#   reference lines
#   // EXERCISE 02.1 STUB
#   // lab::not_done("02.1", "what to do");      <- commented stub lines, uncommented in the student tree
#   // EXERCISE 02.1 END
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LABELS=tests/lab_tests.txt

die() { echo "lab: $*" >&2; exit 1; }

# The project's files: tracked and untracked-but-not-ignored in a git checkout, else every file.
project_files() {
  if git -C "$ROOT" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    git -C "$ROOT" ls-files -co --exclude-standard | while IFS= read -r f; do [[ -f "$ROOT/$f" ]] && echo "$f"; done
  else
    (cd "$ROOT" && find . -path ./build -prune -o -type f -print | sed 's|^\./||')
  fi
}

# The source files that hold a region.
region_files() {
  project_files | grep -E '\.(h|hpp|cpp|cc)$' | while IFS= read -r f; do
    grep -qE '^[[:space:]]*// EXERCISE [0-9]{2}\.[0-9]+ BEGIN' "$ROOT/$f" && echo "$f"
  done
}

# transform MODE FILE: MODE student (regions -> stubs), trace (regions record that they ran) or
# list (one line per region). Stops with file:line on a malformed region.
transform() {
  awk -v mode="$1" -v file="$2" '
    function bad(msg) { printf "lab: %s:%d: %s\n", file, NR, msg > "/dev/stderr"; failed = 1; exit 1 }
    match($0, /^[ \t]*\/\/ EXERCISE [0-9][0-9]\.[0-9]+ (BEGIN|STUB|END)/) {
      n = split(substr($0, RSTART, RLENGTH), w, " ")
      id = w[n - 1]; what = w[n]
      if (what == "BEGIN") {
        if (state != "") bad("EXERCISE " id " BEGIN inside exercise " cur)
        state = "ref"; cur = id; begin = NR
        title = $0; sub(/.*BEGIN:? */, "", title)
        if (mode == "list") printf "%s\t%s:%d\t%s\n", id, file, NR, title
        ind = $0; sub(/[^ ].*/, "", ind)
        if (mode == "trace") { print; print ind "::inferlab::lab::reached(\"" id "\");" }
        if (mode == "student") print ind "// EXERCISE " id ": " title " (replace the stub below)"
        next
      }
      if (id != cur) bad("EXERCISE " id " " what " inside exercise " cur)
      if (what == "STUB") { if (state != "ref") bad("a second STUB"); state = "stub"; stubs = 0; if (mode == "trace") print; next }
      if (state != "stub") bad("EXERCISE " id " END without its STUB")
      if (stubs == 0) bad("EXERCISE " id " has no stub lines")
      state = ""; cur = ""
      if (mode == "trace") print
      next
    }
    state == "ref" { if (mode == "trace") print; next }
    state == "stub" {
      if ($0 !~ /^[ \t]*\/\/ ?/) bad("stub lines of exercise " cur " must be comments")
      stubs++
      if (mode == "student") { line = $0; sub(/\/\/ ?/, "", line); print line }
      else if (mode == "trace") print
      next
    }
    mode != "list" { print }
    END { if (!failed && state != "") { NR = begin; bad("EXERCISE " cur " BEGIN without its END") } }
  ' "$ROOT/$2"
}

list() {
  local f all
  all=$(for f in $(region_files); do transform list "$f"; done | sort -V)
  local twice; twice=$(cut -f1 <<< "$all" | uniq -d)
  [[ -z "$twice" ]] || die "exercise $twice has two regions"
  [[ -z "$all" ]] || echo "$all"
}

# write_tree MODE DEST: the project copied to DEST with its regions transformed.
write_tree() {
  local mode=$1 dest=$2 f
  [[ -n "$dest" ]] || die "usage: tools/lab.sh $mode DEST"
  mkdir -p "$dest"
  dest=$(cd "$dest" && pwd)
  [[ "$dest" != "$ROOT" ]] || die "DEST is the project itself"
  project_files | (cd "$ROOT" && tar -cf - -T -) | (cd "$dest" && tar -xf -)
  for f in $(region_files); do
    transform "$mode" "$f" > "$dest/$f.lab" || die "$f: see above"
    mv "$dest/$f.lab" "$dest/$f"
  done
  echo "lab: wrote the $mode tree in $dest ($(list | wc -l) exercises)"
}

# The tests of one label, one name a line.
tests_with_label() { ctest --test-dir "$1" -N -L "$2" | sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/\1/p'; }

# junit_results XML: "<name> <status> <not_done_ids...>" for every test case in a ctest JUnit file
# (status: run = passed, fail, notrun ...).
junit_results() {
  awk '
    /<testcase / {
      name = $0; sub(/.*name="/, "", name); sub(/".*/, "", name)
      status = $0; sub(/.*status="/, "", status); sub(/".*/, "", status)
      ids = ""
    }
    { line = $0
      while (match(line, /exercise [0-9][0-9]\.[0-9]+ is not done yet/)) {
        split(substr(line, RSTART, RLENGTH), w, " "); ids = ids " " w[2]; line = substr(line, RSTART + RLENGTH) } }
    /<\/testcase>/ { print name, status ids }
  ' "$1"
}

# build_tree DIR: configure and build a written tree with the reference's release preset; its
# tests read the reference's data and shared test data (the same files). With ccache (which the
# build uses when installed, hashing paths relative to the tree) the tree is configured exactly as
# the reference, so that every file it did not change is the reference's object from the cache and
# only the exercise files compile. Without it, the tree is built without the CUDA backend: no
# exercise is in CUDA code, nvcc is most of a build's time, and the CUDA tests skip as they do on
# any machine without a GPU (a student with one builds the tree as usual). Never the benchmarks,
# which no test runs.
build_tree() {
  local flags=(-DINFERLAB_DATA_DIR="$ROOT/data" -DINFERLAB_SHARED_DIR="$ROOT/../shared" -DINFERLAB_BENCHMARKS=OFF)
  command -v ccache > /dev/null || flags+=(-DINFERLAB_CUDA=OFF)
  (cd "$1" && cmake --preset release "${flags[@]}" > /dev/null && cmake --build --preset release)
}

check() {
  local tree="$ROOT/build/lab/student"  # its build is kept between runs: only changes rebuild
  write_tree student "$tree"
  build_tree "$tree"
  local build="$tree/build/release" out; out=$(mktemp -d)
  echo "lab: the tests of no exercise must pass in the student tree"
  ctest --test-dir "$build" -LE '^lab$' -j2 --output-on-failure || die "a test that belongs to no exercise fails in the student tree (if it needs an exercise's code: tools/lab.sh relabel)"
  echo "lab: every exercise test must fail with its 'not done yet' message"
  ctest --test-dir "$build" -L '^lab$' -j2 --output-junit "$out/lab.xml" > "$out/ctest.log" 2>&1 || true
  local problems=0 name status ids
  while read -r name status ids; do
    if [[ "$status" == run ]]; then echo "lab: $name passes in the student tree: it cannot tell a missing exercise"; problems=1
    elif [[ "$status" != fail ]]; then continue  # skipped here (no GPU, no ../shared)
    elif [[ -z "$ids" ]]; then echo "lab: $name fails without an exercise's 'not done yet' message"; problems=1; fi
  done < <(junit_results "$out/lab.xml")
  local id
  while IFS=$'\t' read -r id _ _; do
    tests_with_label "$build" "^ex${id//./\\.}\$" | grep -q . || { echo "lab: exercise $id has no test"; problems=1; }
    grep -q "^| $id |" "$ROOT/docs/labs.md" || { echo "lab: exercise $id is missing from docs/labs.md"; problems=1; }
    cat "$ROOT"/chapters/"${id%%.*}"_*/README.md 2> /dev/null | grep -q "^### $id " ||
      { echo "lab: exercise $id has no section '### $id' in its chapter's README"; problems=1; }
  done < <(list)
  rm -rf "$out"
  [[ $problems == 0 ]] || die "the student tree does not behave as a lab should"
  echo "lab: the student tree is right: $(list | wc -l) exercises, each test of one fails with its message, the rest pass"
}

grade() {
  local build=${1:-build/release} xml=${2:-lab.xml}
  [[ -d "$build" ]] || die "no build folder $build (build first, or name it: tools/lab.sh grade BUILD)"
  ctest --test-dir "$build" -L '^lab$' -j2 --output-junit "$(realpath -m "$xml")" > /dev/null 2>&1 || true
  local results; results=$(junit_results "$xml")
  local id file title label total passed all=0 all_passed=0
  printf '%-8s %-7s %s\n' exercise passed title
  while IFS=$'\t' read -r id file title; do
    label="^ex${id//./\\.}\$"
    total=0; passed=0
    while read -r t; do
      total=$((total + 1))
      awk -v t="$t" '$1 == t && $2 == "run" { found = 1 } END { exit !found }' <<< "$results" && passed=$((passed + 1))
    done < <(tests_with_label "$build" "$label")
    all=$((all + total)); all_passed=$((all_passed + passed))
    printf '%-8s %3d/%-3d %s\n' "$id" "$passed" "$total" "$title"
  done < <(list)
  echo "total: $all_passed/$all exercise tests pass; JUnit report: $xml"
}

relabel() {
  local tree="$ROOT/build/lab/trace"  # kept between runs: only the changed files rebuild
  write_tree trace "$tree"
  build_tree "$tree"
  local trace="$tree/trace.txt"
  rm -f "$trace"
  INFERLAB_LAB_TRACE="$trace" ctest --test-dir "$tree/build/release" -j2 > /dev/null || die "a test fails in the trace tree"
  {
    echo "# Which exercise each test needs: written by tools/lab.sh relabel from a trace tree, where every"
    echo "# exercise region records that it ran. A test carries the last exercise it needs, in course"
    echo "# order, so that it passes once the exercises up to that one are done. ctest labels: lab, ex<id>."
    echo "# test program   exercise   test"
    # trace lines: "<program> <test> <exercise>", one per exercise a test (or a program it ran) reached
    sort -k1,1 -k2,2 -k3,3V -u "$trace" | awk '{ last[$1 " " $2] = $3 } END { for (t in last) { split(t, p, " "); print p[1], last[t], p[2] } }' |
      sort -k2,2V -k1,1 -k3,3
  } > "$ROOT/$LABELS"
  echo "lab: wrote $LABELS ($(grep -vc '^#' "$ROOT/$LABELS") tests)"
}

main() {
  case "${1:-}" in
    list) list ;;
    student) write_tree student "${2:-}" ;;
    trace) write_tree trace "${2:-}" ;;
    check) check ;;
    grade) grade "${2:-}" "${3:-}" ;;
    relabel) relabel ;;
    *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
}

main "$@"; exit  # on one line: bash reads no further, so the script may change while it runs
