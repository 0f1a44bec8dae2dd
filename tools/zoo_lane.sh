#!/usr/bin/env bash
# Trains the named zoo models one after another with each one's committed recipe (or $RECIPE) into
# data/staging/, one CPU thread each; run one lane per core, in the background. Each model
# checkpoints every 250 steps to tools/.work/ckpt/NAME-RECIPE.pt, so running the same lane again
# resumes where it stopped. Logs go to tools/.work/logs/NAME.log, and one line per finished model
# to tools/.work/logs/lanes.log.
#   nohup tools/zoo_lane.sh tiny-mamba tiny-mla > /dev/null 2>&1 &
#   nohup tools/zoo_lane.sh tiny-lti tiny-mamba > /dev/null 2>&1 &   # v3-games, their recipe
# EXTEND=1 passes --extend: start where the committed model's training ended, when the recipe only
# adds phases after it (v3-relay after v3).
set -u
cd "$(dirname "$0")/.."
[ -x tools/.venv/bin/python ] || { echo "tools/.venv is missing: see tools/README.md" >&2; exit 1; }
[ -f tools/.work/train.npy ] || { echo "tools/.work/train.npy is missing: run tools/.venv/bin/python tools/zoo.py data first" >&2; exit 1; }
mkdir -p tools/.work/logs
for m in "$@"; do
  tools/.venv/bin/python tools/zoo.py train "$m" ${RECIPE:+--recipe "$RECIPE"} ${EXTEND:+--extend} --models-dir data/staging --threads 1 \
      >> "tools/.work/logs/$m.log" 2>&1
  echo "$(date +%FT%T) $m exit $?" >> tools/.work/logs/lanes.log
done
