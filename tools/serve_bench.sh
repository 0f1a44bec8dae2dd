#!/usr/bin/env bash
# Chapter 13's server beside llama.cpp's llama-server: the same GGUF files, the same threads, the
# same client (tools/serve_bench.py), the two servers alternating round by round.
#
#   tools/serve_bench.sh [--threads N] [--rounds R] [--max-duration S] [--only REGEX] [--bin DIR] [--out DIR]
#
# 1. llama.cpp's pinned tree (tools/llamacpp_common.sh, shared with tools/llamacpp_bench.sh),
#    built once with llama-server.
# 2. The files: the random 100M-parameter Llama (tools/random_llama.py) and the bundled tiny-mha,
#    each exported to F32 GGUF by `ch09_quantization export --format f32` and quantised by
#    llama-quantize (the types below).
# 3. Per round and file, each server in turn (which goes first alternates by round) is started on
#    127.0.0.1 with THREADS threads and SLOTS sequences at once:
#      ch13_serve --model FILE --threads N --max-num-seqs SLOTS --kv-budget MIB --port 0
#      llama-server -m FILE --cont-batching -np SLOTS -t N -c SLOTS*CTX_PER_SLOT --port P
#    and loaded with streamed /v1/completions at each concurrency of CONCURRENCY, then with
#    Poisson arrivals at RATE.
# 4. Prefix caching: every prompt starting with the same PREFIX_WORDS words, TTFT on ch13_serve
#    with and without --no-prefix-caching (and on llama-server, whose slots keep their prompt).
# Writes DIR/serve.md (the tables), DIR/serve.json and every run's JSON under DIR/runs/.
# --only REGEX keeps the files whose name (random-100m-f32, tiny-mha-Q8_0, ...) matches it, and
# "prefix" in it keeps the shared-prefix runs (default: everything).
# --bin names where ch09_quantization and ch13_serve are (default build/release/bin); without a
# ch13_serve there, llama-server runs alone and the tables say so.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- parameters: sized so that one round takes about 12 minutes on a 2-core machine ----------
THREADS=2              # threads of both servers
ROUNDS=2               # alternating rounds; the tables give the median over rounds
SLOTS=16               # sequences decoded together: llama-server -np, ch13_serve --max-num-seqs
CTX_PER_SLOT=512       # llama-server -c is SLOTS x this (tiny-mha has 512 positions)
KV_BUDGET_MIB=512      # ch13_serve --kv-budget: room for the same SLOTS x CTX_PER_SLOT positions
                       # of the random model in f32 (64 KiB a position; its default 64 MiB holds 1,024)
CONCURRENCY=(1 4 16 64)
REQUESTS=(6 12 32 64)  # requests per concurrency level, in the same order
RATE=2                 # Poisson arrivals per second, and how many requests
RATE_REQUESTS=16
PROMPT_WORDS=16:64     # words per prompt, uniform (about 1.2 tokens a word)
MAX_TOKENS=32          # tokens per request (ignore_eos where the server has it)
WARMUP=2               # uncounted requests after a server starts
MAX_DURATION=60        # no request of a load run starts after this many seconds
RANDOM_TYPES=(Q8_0 Q4_K_M)  # llama-quantize types of the random model (beside F32)
TINY_TYPES=(Q8_0)           # and of tiny-mha (its 128-wide rows do not fit Q4_K's 256-blocks)
PREFIX_WORDS=192       # the shared-prefix runs: words of shared text, then a short prompt,
PREFIX_PROMPT_WORDS=8:24
PREFIX_REQUESTS=12     # one at a time (TTFT without queueing), few tokens
PREFIX_MAX_TOKENS=8
PREFIX_FILE=random-100m-Q8_0.gguf

BIN=build/release/bin OUT=build/serve-bench ONLY=.
while [ $# -gt 0 ]; do  # --threads N, --rounds R, --max-duration S, --only RE, --bin DIR, --out DIR set those
  [[ $# -ge 2 && $1 =~ ^--(threads|rounds|max-duration|only|bin|out)$ ]] ||
    { echo "serve_bench: bad option '$1' (see the header of $0)" >&2; exit 2; }
  name=${BASH_REMATCH[1]^^}
  printf -v "${name//-/_}" %s "$2"
  shift 2
done
PY=tools/.venv/bin/python
[ -x "$BIN/ch09_quantization" ] || { echo "serve_bench: no $BIN/ch09_quantization (make build, or --bin DIR)" >&2; exit 1; }
[ -x "$PY" ] || { echo "serve_bench: set up tools/.venv first (tools/README.md)" >&2; exit 1; }
CH13=$BIN/ch13_serve
SERVERS=(ch13_serve llama-server)
if [ ! -x "$CH13" ]; then
  echo "serve_bench: no $CH13: llama-server alone" >&2
  SERVERS=(llama-server)
fi
. tools/llamacpp_common.sh
mkdir -p "$OUT/runs" "$OUT/logs"
rm -f "$OUT"/runs/*.json

# 1. and 2. llama.cpp and the files
llamacpp_build
llamacpp_gguf_files "$(llamacpp_random_model "$PY")" "$BIN/ch09_quantization" "$THREADS" "${RANDOM_TYPES[@]}"
FILES=("${GGUF_FILES[@]}")
llamacpp_gguf_files data/models/tiny-mha "$BIN/ch09_quantization" "$THREADS" "${TINY_TYPES[@]}"
FILES+=("${GGUF_FILES[@]}")

# A server in the background: start_server NAME FILE LOG [EXTRA ARGS...] sets SERVER_PID and URL
# once /health answers 200; stop_server ends it with SIGTERM (SIGKILL after 30 s).
SERVER_PID=""
start_server() {
  local name=$1 file=$2 log=$3 port i
  shift 3
  LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)  # the 1-minute load average just before it starts
  if [ "$name" = ch13_serve ]; then
    # OMP_NUM_THREADS too: without it the binary takes fewer threads when other work keeps cores busy
    OMP_NUM_THREADS=$THREADS "$CH13" --model "$file" --threads "$THREADS" --max-num-seqs "$SLOTS" \
      --kv-budget "$KV_BUDGET_MIB" --host 127.0.0.1 --port 0 "$@" > "$log" 2>&1 &
    SERVER_PID=$!
    URL=""
  else
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$LLAMACPP_BIN/llama-server" -m "$file" --host 127.0.0.1 --port "$port" --cont-batching -np "$SLOTS" \
      -t "$THREADS" -c $((SLOTS * CTX_PER_SLOT)) --no-webui "$@" > "$log" 2>&1 &
    SERVER_PID=$!
    URL=http://127.0.0.1:$port
  fi
  for i in $(seq 1 1200); do
    kill -0 "$SERVER_PID" 2> /dev/null || { echo "serve_bench: $name exited early, see $log" >&2; tail -5 "$log" >&2; exit 1; }
    [ -n "$URL" ] || URL=$(grep -m1 -oE 'http://[0-9.]+:[0-9]+' "$log" 2> /dev/null || true)
    if [ -n "$URL" ] && curl -sf -o /dev/null "$URL/health"; then return 0; fi
    sleep 0.1
  done
  echo "serve_bench: $name did not answer /health within 120 s, see $log" >&2
  exit 1
}
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM "$SERVER_PID" 2> /dev/null || true
  for _ in $(seq 1 300); do kill -0 "$SERVER_PID" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$SERVER_PID" 2> /dev/null || true
  wait "$SERVER_PID" 2> /dev/null || true
  SERVER_PID=""
}
trap stop_server EXIT

# load RUN_NAME SEED TAGS... -- SERVE_BENCH ARGS...: one load run against $URL into
# runs/RUN_NAME.json. Every load of one server gets its own seed, so no run sends prompts that an
# earlier run on the same server sent (both servers cache prompts); both servers get the same ones.
load() {
  local run=$1 seed=$2 tags=()
  shift 2
  while [ "$1" != -- ]; do tags+=(--tag "$1"); shift; done
  shift
  python3 tools/serve_bench.py --base-url "$URL" --quiet --seed "$seed" --max-duration "$MAX_DURATION" \
    "${tags[@]}" --tag load_before="$LOAD_BEFORE" --out "$OUT/runs/$run.json" "$@" ||
    echo "serve_bench: $run had no successful request" >&2
}

# 3. alternating rounds
for r in $(seq 1 "$ROUNDS"); do
  order=("${SERVERS[@]}")
  [ $((r % 2)) = 0 ] && [ ${#SERVERS[@]} = 2 ] && order=("${SERVERS[1]}" "${SERVERS[0]}")
  for f in "${FILES[@]}"; do
    fb=$(basename "$f" .gguf)
    [[ $fb =~ $ONLY ]] || continue
    for s in "${order[@]}"; do
      start_server "$s" "$f" "$OUT/logs/r$r-$s-$fb.log"
      echo "round $r $fb $s ($URL)" >&2
      common=(round=$r server=$s file="$fb" --)
      for i in "${!CONCURRENCY[@]}"; do
        c=${CONCURRENCY[$i]} w=0
        [ "$i" = 0 ] && w=$WARMUP
        load "r$r-$s-$fb-c$c" $((100 * r + i)) "${common[@]}" --concurrency "$c" -n "${REQUESTS[$i]}" --warmup "$w" \
          --prompt-words "$PROMPT_WORDS" --max-tokens "$MAX_TOKENS"
      done
      load "r$r-$s-$fb-poisson" $((100 * r + 99)) "${common[@]}" --rate "$RATE" -n "$RATE_REQUESTS" \
        --prompt-words "$PROMPT_WORDS" --max-tokens "$MAX_TOKENS"
      stop_server
    done
  done
done

# 4. shared prefix, one server at a time, same prompts for each
f=$LLAMACPP_WORK/$PREFIX_FILE
for r in $(seq 1 "$ROUNDS"); do
  [[ prefix =~ $ONLY ]] || break
  for s in "${SERVERS[@]}"; do
    variants=(default)
    [ "$s" = ch13_serve ] && variants=(default no-prefix-caching)
    for v in "${variants[@]}"; do
      extra=()
      [ "$v" = no-prefix-caching ] && extra=(--no-prefix-caching)
      start_server "$s" "$f" "$OUT/logs/r$r-$s-prefix-$v.log" "${extra[@]}"
      echo "round $r prefix $s $v ($URL)" >&2
      load "r$r-$s-prefix-$v" $((100 * r + 50)) round="$r" server="$s" file="$(basename "$f" .gguf)" prefix="$v" -- \
        --concurrency 1 -n "$PREFIX_REQUESTS" --warmup 1 --shared-prefix "$PREFIX_WORDS" \
        --prompt-words "$PREFIX_PROMPT_WORDS" --max-tokens "$PREFIX_MAX_TOKENS"
      stop_server
    done
  done
done

commit=$(git rev-parse --short HEAD)
bin_commit=$(git -C "$BIN" rev-parse --short HEAD 2> /dev/null || echo unknown)
python3 - "$OUT" "$THREADS" "$ROUNDS" "$SLOTS" "$LLAMACPP_COMMIT" "$commit" "$bin_commit" "${SERVERS[*]}" <<'PY'
import glob, json, os, statistics, sys
out, threads, rounds, slots, llama, commit, bin_commit, servers = sys.argv[1:9]
runs = [json.load(open(p)) for p in glob.glob(os.path.join(out, "runs", "*.json"))]
runs.sort(key=lambda r: min((q["start"] for q in r["requests"]), default=0))  # the order they ran in

def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None

def f(v, d=1):
    return "-" if v is None else f"{v:.{d}f}"

def load_name(d):
    return f"c={d['concurrency']}" if d["mode"] == "concurrency" else f"Poisson {d['rate']:g}/s"

def group(rs):
    """Medians over rounds of one (server, file, load)."""
    s = [r["summary"] for r in rs]
    return {"rounds": len(rs), "ok": sum(x["requests_ok"] for x in s), "sent": sum(x["requests_sent"] for x in s),
            "errors": sum(sum(x["errors"].values()) for x in s),
            "tok_s": med(x["output_tokens_per_s"] for x in s), "req_s": med(x["requests_per_s"] for x in s),
            "prompt_tokens": med(x["prompt_tokens_mean"] for x in s),
            **{f"{m}_{p}": med(x[f"{m}_ms"][p] for x in s) for m in ("ttft", "tpot", "itl", "e2e") for p in ("p50", "p99")}}

main = [r for r in runs if "prefix" not in r["tags"]]
keys = list(dict.fromkeys((r["tags"]["file"], load_name(r), r["tags"]["server"]) for r in main))
rows, table = [], ["| server | file | load | ok/sent | tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | e2e p50 | ch13/llama-server tok/s |",
                   "|---|---|---|---|---|---|---|---|---|---|---|"]
cells = {}
for k in keys:
    cells[k] = group([r for r in main if (r["tags"]["file"], load_name(r), r["tags"]["server"]) == k])
first = {}
for k in keys:
    first.setdefault(k[:2], len(first))
for (file, ld, server) in sorted(keys, key=lambda k: (first[k[:2]], k[2])):
    g = cells[(file, ld, server)]
    ratio = ""
    other = cells.get((file, ld, "llama-server"))
    if server == "ch13_serve" and other and g["tok_s"] and other["tok_s"]:
        ratio = f"{g['tok_s'] / other['tok_s']:.2f}"
        g["ratio_tok_s"] = g["tok_s"] / other["tok_s"]
    table.append(f"| {server} | {file} | {ld} | {g['ok']}/{g['sent']} | {f(g['tok_s'])} | {f(g['ttft_p50'])} | {f(g['ttft_p99'])} | "
                 f"{f(g['tpot_p50'], 2)} | {f(g['tpot_p99'], 2)} | {f(g['e2e_p50'])} | {ratio} |")
    rows.append({"server": server, "file": file, "load": ld, **g})

pre = [r for r in runs if "prefix" in r["tags"]]
pkeys = list(dict.fromkeys((r["tags"]["server"], r["tags"]["prefix"]) for r in pre))
ptable = ["| server | prefix caching | prompt tokens | TTFT p50 | TTFT p99 | e2e p50 |", "|---|---|---|---|---|---|"]
prows = []
for k in pkeys:
    g = group([r for r in pre if (r["tags"]["server"], r["tags"]["prefix"]) == k])
    ptable.append(f"| {k[0]} | {'off' if k[1] == 'no-prefix-caching' else 'on (default)'} | {f(g['prompt_tokens'], 0)} | "
                  f"{f(g['ttft_p50'])} | {f(g['ttft_p99'])} | {f(g['e2e_p50'])} |")
    prows.append({"server": k[0], "variant": k[1], **g})

head = (f"{rounds} alternating round(s), {threads} threads and {slots} slots per server; times in ms; TPOT percentiles over "
        f"per-request TPOTs (first to last token over completion_tokens - 1), medians over rounds; ok/sent summed over rounds; "
        f"servers: {servers}; InferLab {bin_commit} (ch13_serve, ch09_quantization), scripts {commit}; llama.cpp: {llama}")
pfile = pre[0]["tags"]["file"] if pre else "-"
loads = [float(r["tags"]["load_before"]) for r in runs if "load_before" in r["tags"]]
if loads:
    head += f"; 1-minute load average before each server started: {min(loads):.2f} to {max(loads):.2f}"
md = head + "\n\n" + "\n".join(table) + "\n\nShared prefix (" + pfile + ", one request at a time):\n\n" + "\n".join(ptable) + "\n"
open(os.path.join(out, "serve.md"), "w").write(md)
json.dump({"threads": int(threads), "rounds": int(rounds), "slots": int(slots), "llama_cpp": llama, "commit": commit,
           "inferlab_bin_commit": bin_commit, "servers": servers.split(), "rows": rows, "prefix": prows},
          open(os.path.join(out, "serve.json"), "w"), indent=1)
print(md)
PY
