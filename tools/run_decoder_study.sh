#!/usr/bin/env bash
# The decoder study (issue 41; nbs/42_decoder_study.ipynb): a small causal LM per position encoding,
# pretrained with the `study` preset of `posenc_lit lm` (64-token blocks) and evaluated at 1×, 2×, 4×, 8× the
# training length; and the causal probes (counting, selective copy, flip-flop, offset, index, precede) at 32 …
# 256 tokens, three seeds.
#
# Usage: bash tools/run_decoder_study.sh NAME [NAME ...]
#   NAME is ENTRY (seed 0), ENTRY-sK (seed K > 0), or probes-ENTRY (the causal probes of ENTRY, every seed);
#   ENTRY is one of posenc_lit.decoder_study.ENTRIES (none learned sinusoidal rope alibi t5 fire cope) and
#   must be a registered encoding. Start one lane per core with its own names, e.g.
#     OMP_NUM_THREADS=1 bash tools/run_decoder_study.sh rope rope-s1 rope-s2 probes-rope &
#     OMP_NUM_THREADS=1 bash tools/run_decoder_study.sh none none-s1 none-s2 probes-none &
# A run trains in runs/decoder/NAME and resumes from its checkpoint when started again (a finished one is
# skipped); then results/decoder/NAME/ gets config.json, metrics.jsonl, summary.json and lengths.json and is
# committed (COMMIT=0 to skip). probes-ENTRY writes results/decoder/probes/ENTRY.json after every (probe,
# seed), resumes from it, and is committed when all are done. PRESET=smoke runs both kinds with their smoke
# presets (seconds; for tests).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lane_lib.sh"   # commit_result
# STUDY_ROOT: the checkout to write into (the code may be a frozen copy)
cd "${STUDY_ROOT:-$(dirname "$0")/..}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if [ $# -eq 0 ]; then
  echo "usage: bash tools/run_decoder_study.sh NAME [NAME ...] (ENTRY, ENTRY-sK or probes-ENTRY)" >&2
  exit 2
fi
# every name is checked before the first run starts: a known entry, registered as an encoding
known=$(python -c 'from posenc_lit.decoder_study import ENTRIES; print(*ENTRIES)')
registered=$(python -c 'from posenc_lit.core import list_encodings; print(*list_encodings())')
for name in "$@"; do
  entry=${name#probes-}
  if [[ $entry =~ ^(.+)-s([1-9][0-9]{0,8})$ ]] && [[ $name != probes-* ]]; then entry=${BASH_REMATCH[1]}; fi
  if [[ " $known " != *" $entry "* ]]; then
    echo "run_decoder_study.sh: unknown entry '$name'; nothing was run. Entries: $known" \
      "(seed K > 0: ENTRY-sK; the causal probes: probes-ENTRY)" >&2
    exit 2
  fi
  if [[ " $registered " != *" $entry "* ]]; then
    echo "run_decoder_study.sh: '$entry' is not a registered encoding yet (posenc_lit encodings);" \
      "nothing was run" >&2
    exit 2
  fi
done

for name in "$@"; do
  if [[ $name == probes-* ]]; then
    entry=${name#probes-} dest=results/decoder/probes/$entry.json
    mkdir -p results/decoder/probes
    python -c 'import sys
from posenc_lit.decoder_study import run_causal_probes as r, make_causal_probe_config as c
r(sys.argv[1], cfg=c(sys.argv[3]), out=sys.argv[2])' "$entry" "$dest" "${PRESET:-study}"
    commit_result "decoder study: $name finished (tools/run_decoder_study.sh)" "$dest"
    continue
  fi
  entry=$name seed=0
  if [[ $name =~ ^(.+)-s([1-9][0-9]*)$ ]]; then entry=${BASH_REMATCH[1]} seed=${BASH_REMATCH[2]}; fi
  run=runs/decoder/$name dest=results/decoder/$name
  if [ -f "$dest/summary.json" ] && [ -f "$dest/lengths.json" ]; then
    echo "done already: $name"
    continue
  fi
  posenc_lit lm --pe "$entry" --preset "${PRESET:-study}" --seed "$seed" --out "$run" --resume --quiet
  mkdir -p "$dest"
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" "$run/lengths.json" "$dest/"
  # FIRE's learned threshold L (42_decoder_study: does its normalization by max(L, i) act at the lengths read?)
  if [ "$entry" = fire ]; then python "$HERE/fire_threshold.py" "$run" "$dest"; fi
  commit_result "decoder study: $name finished (tools/run_decoder_study.sh)" "$dest"
  echo "finished $name: $(tr -d '\n ' < "$dest/summary.json")"
done
