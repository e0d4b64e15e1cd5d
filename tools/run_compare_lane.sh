#!/usr/bin/env bash
# One lane of the reference `posenc_lit compare` study (issue 6): the encodings named run, one after another, in
# their own folder results/compare/reference.lane-NAME, so that two lanes can use the two cores at once (two calls on
# one folder would both rewrite its results.json). When a lane's encodings are finished, fold them into the study with
#   python tools/merge_compare_lanes.py
# which moves every encoding whose stages all finished into results/compare/reference and rebuilds its results.json
# and figures (finished stages are only read). Usage: bash tools/run_compare_lane.sh NAME ENCODING [ENCODING ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
lane=$1; shift
posenc_lit compare --preset reference --encodings "$@" --no-vit --out "results/compare/reference.lane-$lane" --quiet
