#!/usr/bin/env bash
# Draws every chapter's figure on this machine into docs/figures/ and writes the gallery page,
# docs/figures.md, with the command, the machine and the commit under each figure:
#   tools/figures.sh [BIN_DIR]      (make figures: BIN_DIR = build/release/bin)
# Each figure comes from its chapter's own run (--svg), at the bare run's settings or smaller,
# so that the whole set takes minutes. FIGURES="ch02 ch10" draws only the figures whose names
# begin so; the gallery still lists all of them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$(cd "${1:-$root/build/release/bin}" && pwd)"
out="$root/docs/figures"
mkdir -p "$out"
cd "$root"

machine="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
machine="${machine:-$(uname -m)}, $(nproc) cores, $(uname -s)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD -- chapters common ':!*.md' 2>/dev/null || commit="$commit with local changes"
today="$(date -u +%Y-%m-%d)"

# name | chapter | caption | command (run from the repository root; FIG is the output file;
# "same": drawn by the command before it, which writes both)
figures=(
  "ch00-roofline.svg|00|This machine's measured roofline, with the datasheet roofs of an A100, H100 and H200|ch00_workload roofline --svg FIG"
  "ch01-naive.svg|01|Naive decoding: time per token grows with the sequence, since every step re-runs all of it; the fitted power law and the attention FLOPs' exponent|ch01_naive_decode --svg FIG"
  "ch02-kv-cache.svg|02|Time per token against position, naive against the KV cache, each with its fitted exponent|ch02_kv_cache --svg FIG"
  "ch03-gqa.svg|03|KV bytes per sequence (the formula 2·L·K·H·S·4 and each variant) and decode throughput (measured beside the roofline) against the number of KV heads K|ch03_gqa --svg FIG"
  "ch04-mla.svg|04|One MLA layer's decode step against context, the plain path (rebuilding K and V) against the absorbed one, each beside its roofline|ch04_mla --svg FIG"
  "ch05-cla.svg|05|Sequences that fit a fixed KV budget, and decode throughput at that batch, against the sharing factor s|ch05_cla --svg FIG"
  "ch06-recall.svg|06|Probe accuracy against the distance of the fact, with tiny-swa's receptive field|ch06_local_attention recall --svg FIG --reach-svg docs/figures/ch06-reach.svg"
  "ch06-reach.svg|06|A token's influence on the last logits against its distance, with tiny-swa's receptive field|same"
  "ch07-mamba.svg|07|One decode step against position (a transformer's grows, Mamba's stays flat), and associative recall against the pairs to remember|ch07_mamba --svg FIG"
  "ch08-diffusion.svg|08|Tokens per forward pass (beside L/R), tokens/s and the validation NELBO against the denoising steps R|ch08_diffusion_lm --svg FIG --canvas-svg docs/figures/ch08-canvas.svg"
  "ch08-canvas.svg|08|tiny-mdlm filling a canvas of 32 masks in 16 steps: what each step committed|same"
  "ch09-quantization.svg|09|Perplexity and decode tokens/s against bits per weight, the speed beside its memory-bound ceiling|ch09_quantization --svg FIG"
  "ch10-speculative.svg|10|Measured speed-up against γ on the formula's curves (1 − α^(γ+1)) / ((1 − α)(γc + 1)) for several α|ch10_speculative_sampling --svg FIG"
  "ch11-timeline.svg|11|Sequences per step over time: static batching against continuous batching on the same trace|ch11_continuous_batching trace --svg FIG"
  "ch12-waste.svg|12|Wasted KV memory and sequences per step against block size, paged against contiguous max-length caches|ch12_paged_attention memory --more-block-sizes 1,2,4,8,32,64,128 --svg FIG"
  "ch12-block-table.svg|12|The block tables of 8 samples forked after one prompt: shared blocks, the copied-on-write block, each sample's own|ch12_paged_attention sharing --svg FIG"
)

previous=""
for entry in "${figures[@]}"; do
  IFS='|' read -r name chapter caption command <<<"$entry"
  if [ "$command" = same ]; then
    [ -f "$out/${previous%.svg}.made" ] && cp "$out/${previous%.svg}.made" "$out/${name%.svg}.made"
    continue
  fi
  previous="$name"
  if [ -n "${FIGURES:-}" ] && ! printf '%s\n' $FIGURES | grep -q "^${name%%-*}"; then continue; fi
  exe="${command%% *}"
  args="${command#* }"
  args="${args//FIG/docs/figures/$name}"
  echo "== $name: $exe $args"
  start=$(date +%s)
  eval "\"$bin/$exe\" $args" >"$out/${name%.svg}.log" 2>&1 || {
    tail -20 "$out/${name%.svg}.log"
    echo "figures: $exe failed (log: docs/figures/${name%.svg}.log)" >&2
    exit 1
  }
  rm -f "$out/${name%.svg}.log"
  printf '%s|%s|%s\n' "$machine" "$commit" "$today" >"$out/${name%.svg}.made"
  echo "   $(($(date +%s) - start)) s"
done

# The gallery: every figure in chapter order, its command, and where and from what it was made.
{
  cat <<'EOF'
# Figures

Every chapter's central measurement as a picture, each drawn by the chapter's own executable
(`--svg FILE`, common/plot.h) from the same run that prints its table, at the bare run's settings
or smaller. `make figures` draws them all again on your machine (`tools/figures.sh`: about ten
minutes on two busy cores, six of them chapter 06's 200 probes per kind); measured figures will
differ from these with the machine and its load, the formulas and counts will not. Under each figure: the command that drew it, and the machine and commit it was drawn on.

EOF
  last=""
  for entry in "${figures[@]}"; do
    IFS='|' read -r name chapter caption command <<<"$entry"
    if [ "$command" = same ]; then command="$drawn_by"; else drawn_by="$command"; fi
    readme="$(ls -d chapters/${chapter}_*/README.md)"
    title="$(head -1 "$readme" | sed 's/^# *//')"
    if [ "$chapter" != "$last" ]; then
      printf '## %s\n\n' "$title"
      last="$chapter"
    fi
    made="where and from what commit: not recorded"
    if [ -f "$out/${name%.svg}.made" ]; then
      IFS='|' read -r m c d <"$out/${name%.svg}.made"
      made="on $m, commit $c, $d"
    fi
    shown="${command//FIG/docs/figures/$name}"
    printf '![%s](figures/%s)\n\n' "$caption" "$name"
    printf 'Drawn by `%s` %s.\n\n' "$shown" "$made"
  done
} >"$root/docs/figures.md"
echo "wrote docs/figures.md and $(ls "$out"/*.svg | wc -l) figures in docs/figures/"
