#!/usr/bin/env bash
# The course labs (docs/labs.md): exercise regions in the reference code, the student tree made
# from them, and the checks and grades built on the ctest labels of tests/lab_tests.txt.
#
#   tools/lab.sh list                 every exercise: id, file:line, title
#   tools/lab.sh student DEST         write the student tree: each region replaced by its stub
#   tools/lab.sh check                write and build the student tree in build/lab/student, and
#                                     check that it builds without warnings, that exactly the
#                                     exercise tests fail, each with its "not done yet" message,
#                                     and that grading it counts them all (CI: make lab-check)
#   tools/lab.sh grade [BUILD] [XML]  run the exercise tests, print a score per exercise and
#                                     write a JUnit XML report (default build/release, lab.xml)
#   tools/lab.sh relabel              rebuild tests/lab_tests.txt: build a trace tree, run every
#                                     test, record which exercises each one reaches
#   tools/lab.sh filter FILE          print FILE as the student tree has it (the docs site's
#                                     input filter: the site shows stubs, never a solution)
#   tools/lab.sh sample               write docs/labs.md's sample of `make grade`: what the
#                                     student tree prints (check fails when it is stale)
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

# The project's files: tracked and untracked-but-not-ignored when the project is the top of a git
# checkout, else every file (a student tree written under the reference's ignored build/ is not
# the reference's checkout).
project_files() {
  if [[ "$(git -C "$ROOT" rev-parse --show-toplevel 2> /dev/null)" == "$(cd "$ROOT" && pwd -P)" ]]; then
    git -C "$ROOT" ls-files -co --exclude-standard | while IFS= read -r f; do [[ -f "$ROOT/$f" ]] && echo "$f"; done
  else
    (cd "$ROOT" && find . -path ./build -prune -o -type f -print | sed 's|^\./||')
  fi
}

# The source files that hold a region: a reference region (BEGIN), or in a student tree the line
# its region became ("// EXERCISE 02.1: title (replace the stub below)"), so that list and grade
# work in either tree.
region_files() {
  project_files | grep -E '\.(h|hpp|cpp|cc)$' | while IFS= read -r f; do
    grep -qE '^[[:space:]]*// EXERCISE [0-9]{2}\.[0-9]+( BEGIN|: .* \(replace the stub below\)$)' "$ROOT/$f" && echo "$f"
  done
}

# transform MODE FILE: MODE student (regions -> stubs), trace (regions record that they ran) or
# list (one line per region). Stops with file:line on a malformed region.
transform() {
  awk -v mode="$1" -v file="$2" '
    function bad(msg) { printf "lab: %s:%d: %s\n", file, NR, msg > "/dev/stderr"; failed = 1; exit 1 }
    mode == "list" && match($0, /^[ \t]*\/\/ EXERCISE [0-9][0-9]\.[0-9]+: .* \(replace the stub below\)$/) {
      id = $0; sub(/^[ \t]*\/\/ EXERCISE /, "", id); sub(/:.*/, "", id)
      title = $0; sub(/^[^:]*: /, "", title); sub(/ \(replace the stub below\)$/, "", title)
      printf "%s\t%s:%d\t%s\n", id, file, NR, title
      next
    }
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
  local tree="$ROOT/build/lab/student" graded
  graded=$(student_grade)
  local build="$tree/build/release" out; out=$(mktemp -d)
  echo "lab: the student tree builds without warnings"
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
  echo "lab: grading the student tree must count every exercise test, none passing"
  local labelled listed_tests rows
  labelled=$(ctest --test-dir "$build" -N -L '^lab$' | sed -n 's/^Total Tests: //p')
  listed_tests=$(grep -vc '^#' "$ROOT/$LABELS")
  rows=$(awk '$1 ~ /^[0-9][0-9]\.[0-9]+$/ { split($2, f, "/"); n += f[2]; p += f[1]; k++ } END { print k + 0, n + 0, p + 0 }' <<< "$graded")
  local want_rows; want_rows=$(list | wc -l)
  [[ "$rows" == "$want_rows $listed_tests 0" ]] ||
    { echo "lab: the student tree's grade has (exercises, tests, passing) = ($rows), not ($want_rows $listed_tests 0)"; problems=1; }
  [[ "$labelled" == "$listed_tests" ]] || { echo "lab: ctest labels $labelled tests 'lab', $LABELS lists $listed_tests"; problems=1; }
  grep -qx "total: 0/$listed_tests exercise tests pass; JUnit report: lab.xml" <<< "$graded" ||
    { echo "lab: the student tree's grade does not end 'total: 0/$listed_tests':"; tail -1 <<< "$graded"; problems=1; }
  echo "lab: docs/labs.md's sample of make grade must be what the student tree prints"
  if ! splice_sample "$ROOT/docs/labs.md" "$graded" | diff -u "$ROOT/docs/labs.md" - > "$out/sample.diff"; then
    cat "$out/sample.diff"; echo "lab: docs/labs.md's sample is stale: tools/lab.sh sample rewrites it"; problems=1
  fi
  rm -rf "$out"
  [[ $problems == 0 ]] || die "the student tree does not behave as a lab should"
  echo "lab: the student tree is right: $(list | wc -l) exercises, $listed_tests exercise tests, each failing with its message, the rest passing, graded 0/$listed_tests"
}

# grade [BUILD] [XML]: the score of each exercise: how many of its tests pass. The exercises are
# those of tests/lab_tests.txt (which the student tree keeps as it is) with their titles from the
# region markers; an exercise whose marker is gone is still graded.
grade() {
  local build=${1:-build/release} xml=${2:-lab.xml}
  [[ -d "$build" ]] || die "no build folder $build (build first, or name it: tools/lab.sh grade BUILD)"
  ctest --test-dir "$build" -L '^lab$' -j2 --output-junit "$(realpath -m "$xml")" > /dev/null 2>&1 || true
  local results; results=$(junit_results "$xml")
  local listed; listed=$(list)
  local id title label total passed all=0 all_passed=0
  printf '%-8s %-7s %s\n' exercise passed title
  while read -r id; do
    title=$(awk -F'\t' -v id="$id" '$1 == id { print $3 }' <<< "$listed")
    label="^ex${id//./\\.}\$"
    total=0; passed=0
    while read -r t; do
      total=$((total + 1))
      awk -v t="$t" '$1 == t && $2 == "run" { found = 1 } END { exit !found }' <<< "$results" && passed=$((passed + 1))
    done < <(tests_with_label "$build" "$label")
    all=$((all + total)); all_passed=$((all_passed + passed))
    [[ -n "$title" ]] || title="(the marker line of its region is gone)"
    printf '%-8s %3d/%-3d %s\n' "$id" "$passed" "$total" "$title"
  done < <({ grep -v '^#' "$ROOT/$LABELS" | awk '{ print $2 }'; cut -f1 <<< "$listed"; } | grep . | sort -uV)
  echo "total: $all_passed/$all exercise tests pass; JUnit report: $xml"
}

# The sample of `make grade` in docs/labs.md: what a fresh student tree prints (every row 0/N),
# between the two marker lines below. The sample is the output of grade, not typed: `tools/lab.sh
# sample` writes it, and check fails when it differs from what the student tree prints.
SAMPLE_BEGIN='<!-- sample: tools/lab.sh sample writes the lines below; make lab-check compares them -->'
SAMPLE_END='<!-- end of sample -->'

# splice_sample FILE TEXT: docs/labs.md with TEXT between the markers (on stdout).
splice_sample() {
  awk -v begin="$SAMPLE_BEGIN" -v end="$SAMPLE_END" -v text="$2" '
    $0 == begin { print; print "```"; print text; print "```"; skip = 1; seen = 1; next }
    $0 == end { skip = 0 }
    !skip { print }
    END { if (!seen) { print "lab: no sample markers in docs/labs.md" > "/dev/stderr"; exit 1 } }
  ' "$1"
}

# student_grade: writes and builds the student tree (build/lab/student) and prints its grade, run
# in the tree as `make grade` runs it. Fails on a compiler warning in the student tree's build.
student_grade() {
  local tree="$ROOT/build/lab/student"  # its build is kept between runs: only changes rebuild
  write_tree student "$tree" >&2
  local log="$ROOT/build/lab/student-build.log"
  build_tree "$tree" 2>&1 | tee "$log" >&2 || die "the student tree does not build (log: $log)"
  # Every file with a region is written anew, so it compiles again on every run and its messages
  # are in the log (from ccache too, which keeps them). Its compile must warn no more than the
  # reference's: a stub must (void) what only the reference lines read. (Files without a region
  # are the reference's; whatever they print, they print in the reference build too.)
  local warned
  warned=$(region_files | awk '
    NR == FNR { n = split($0, p, "/"); base[++k] = "/" p[n] ".o"; dir[k] = substr($0, 1, length($0) - length(p[n]) - 1) "/CMakeFiles/"; next }
    /^\[[0-9]+\/[0-9]+\] / { file = ""; for (i = 1; i <= k; ++i) if (index($0, dir[i]) && substr($0, length($0) - length(base[i]) + 1) == base[i]) file = $NF }
    file != "" && /warning:/ { print file ": " $0 }
  ' - "$log")
  [[ -z "$warned" ]] || { echo "$warned" >&2; die "the student tree builds with warnings in its exercise files (above; log: $log)"; }
  (cd "$tree" && tools/lab.sh grade build/release lab.xml)
}

sample() {
  local out; out=$(student_grade)
  splice_sample "$ROOT/docs/labs.md" "$out" > "$ROOT/docs/labs.md.new"
  mv "$ROOT/docs/labs.md.new" "$ROOT/docs/labs.md"
  echo "lab: wrote the sample of make grade in docs/labs.md ($(wc -l <<< "$out") lines)"
}

relabel() {
  local tree="$ROOT/build/lab/trace"  # kept between runs: only the changed files rebuild
  write_tree trace "$tree"
  build_tree "$tree"
  local trace="$tree/trace.txt"
  rm -f "$trace"
  INFERLAB_LAB_TRACE="$trace" ctest --test-dir "$tree/build/release" -j2 > /dev/null || die "a test fails in the trace tree"
  # The chapter_cli lines name the runs of tests/chapter_cli.cmake, which carry their exercise
  # there (LAB) and leave no trace, and the serve lines the client tests of chapter 13's server
  # (tests/serve), whose exercise code runs in the server they start: they are kept as they are.
  local cli; cli=$(grep -E '^(chapter_cli|serve) ' "$ROOT/$LABELS" || true)
  {
    echo "# Which exercise each test needs: written by tools/lab.sh relabel from a trace tree, where every"
    echo "# exercise region records that it ran. A test carries the last exercise it needs, in course"
    echo "# order, so that it passes once the exercises up to that one are done. ctest labels: lab, ex<id>."
    echo "# test program   exercise   test"
    # trace lines: "<program> <test> <exercise>", one per exercise a test (or a program it ran) reached
    { sort -k1,1 -k2,2 -k3,3V -u "$trace" | awk '{ last[$1 " " $2] = $3 } END { for (t in last) { split(t, p, " "); print p[1], last[t], p[2] } }'
      [[ -z "$cli" ]] || echo "$cli"; } | sort -k2,2V -k1,1 -k3,3
  } > "$ROOT/$LABELS"
  echo "lab: wrote $LABELS ($(grep -vc '^#' "$ROOT/$LABELS") tests)"
}

# filter FILE: the file as the student tree has it, on stdout: Doxygen's input filter for the
# sources (docs/Doxyfile.in), so that the documentation site never shows a solution.
filter() {
  local f=$1
  [[ -f "$f" ]] || die "filter: no file $f"
  f=$(realpath "$f")
  local root; root=$(realpath "$ROOT")
  [[ "$f" == "$root/"* ]] || { cat "$f"; return; }
  transform student "${f#"$root/"}"
}

main() {
  case "${1:-}" in
    list) list ;;
    student) write_tree student "${2:-}" ;;
    trace) write_tree trace "${2:-}" ;;
    check) check ;;
    grade) grade "${2:-}" "${3:-}" ;;
    sample) sample ;;
    filter) filter "${2:-}" ;;
    relabel) relabel ;;
    *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
}

main "$@"; exit  # on one line: bash reads no further, so the script may change while it runs
