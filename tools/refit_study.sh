#!/usr/bin/env bash
# Fine-tune a committed study run whose checkpoint is gone (checkpoints do not survive a change of machine).
#
# Usage: bash tools/refit_study.sh NAME [NAME ...]
#   NAME: a committed study run (results/study/NAME), e.g. learned-s1
#
# Each NAME is pretrained again from scratch with tools/run_study.sh in a scratch worktree of this
# checkout (runs/refit/NAME, without results/study/NAME; nothing is committed there), with the same entry,
# seed, preset and learning rate. Its held-out loss is compared with the committed one. Within TOL nats
# (default 0.02) the re-run stands for the committed run: its fine-tuning results (order and sentiment, as
# run_study.sh fine-tunes: three fine-tuning seeds for pretraining seed 0, one otherwise) are copied to
# results/study_TASK/NAME/, the re-run's summary and curve to results/study/NAME/refit_summary.json and
# refit_metrics.jsonl, all committed (COMMIT=0 to skip), and the worktree is removed. Past TOL nothing is
# copied: the re-run is another pretraining run, not the committed one (float sums differ between CPUs; the
# message gives both losses).
# STUDY_ROOT: the checkout to read and write (the code may be a frozen copy, as in tools/run_study.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "${STUDY_ROOT:-$HERE/..}"
ROOT=$(pwd)
source "$HERE/lane_lib.sh"   # commit_result
tol=${TOL:-0.02}
if [ $# -eq 0 ]; then
  echo "usage: bash tools/refit_study.sh NAME [NAME ...]   (committed study runs)" >&2
  exit 2
fi
for name in "$@"; do
  [ -f "results/study/$name/summary.json" ] \
    || { echo "refit_study.sh: no committed study run $name (results/study/$name/summary.json);" \
           "nothing was run" >&2; exit 2; }
  [ ! -f "results/study/$name/refit_summary.json" ] && [ -f "results/study_order/$name/summary.json" ] \
    && { echo "refit_study.sh: $name is fine-tuned already (results/study_order/$name); nothing was run" >&2
         exit 2; }
done

for name in "$@"; do
  if [ -f "results/study/$name/refit_summary.json" ]; then echo "done already: $name"; continue; fi
  w=$ROOT/runs/refit/$name
  if [ ! -d "$w" ]; then
    git worktree add -q --detach "$w" HEAD
    for task in study study_order study_sentiment; do rm -rf "$w/results/$task/$name"; done
  fi
  COMMIT=0 STUDY_ROOT=$w bash "$HERE/run_study.sh" "$name"
  new_summary=$w/results/study/$name/summary.json
  read -r old new ok < <(python - "results/study/$name/summary.json" "$new_summary" "$tol" <<'EOF'
import json, sys
old, new = (json.load(open(p))['eval_loss'] for p in sys.argv[1:3])
print(f'{old:.4f} {new:.4f} {int(abs(new - old) <= float(sys.argv[3]))}')
EOF
)
  if [ "$ok" != 1 ]; then
    echo "refit_study.sh: $name re-run ends at $new nats, the committed run at $old (|Δ| > $tol):" \
      "not copied; its results stay in $w" >&2
    continue
  fi
  cp "$new_summary" "results/study/$name/refit_summary.json"
  cp "$w/results/study/$name/metrics.jsonl" "results/study/$name/refit_metrics.jsonl"
  for task in order sentiment; do
    mkdir -p "results/study_$task/$name"
    cp -r "$w/results/study_$task/$name/." "results/study_$task/$name/"
  done
  commit_result "study: $name pretrained again, $new nats (committed: $old), and fine-tuned" \
    results/study/"$name"/refit_{summary.json,metrics.jsonl} results/study_{order,sentiment}/"$name"
  git worktree remove --force "$w"
  echo "refit $name: $old -> $new nats; fine-tuned on order and sentiment"
done
