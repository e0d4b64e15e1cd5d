#!/usr/bin/env bash
# The README's sample run of `posenc_lit compare --preset quick` (issue 38), made from a clean tree of COMMIT.
#
# Usage: bash tools/make_quick_sample.sh COMMIT      (on idle cores: about 15 minutes)
#
# Clones this repository at COMMIT into a temporary folder (a clean tree: the run's results.json records COMMIT and
# git_dirty false), runs the quick preset there (one command, timed), copies its results.json and what it printed to
# results/compare/quick/ of this checkout, then makes the README's sample again from that file: the sample cell of
# nbs/index.ipynb (id 6c829d98) is run again after the cells above it (no other cell's output is touched) and
# README.md regenerated (tools/make_readme.py), and so are the cells of nbs/30_compare.ipynb that show the quick
# study (its tables, times and figures). tests/test_readme_sample.py checks the README against the file.
# Commit the four afterwards.
# PYTHON: an interpreter with posenc_lit's dependencies (default: python). Threads: PyTorch's default (one per core)
# unless OMP_NUM_THREADS is set; the run records which in results.json (`environment`). COMPARE_ARGS: more options
# of `compare`, only for trying this script out (e.g. COMPARE_ARGS='--encodings none'; the test then fails).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: bash tools/make_quick_sample.sh COMMIT" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python}
commit=$(git -C "$here" rev-parse --verify "$1^{commit}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q "$(git -C "$here" rev-parse --path-format=absolute --git-common-dir)" "$tmp/clone"
git -C "$tmp/clone" checkout -q --detach "$commit"
[ -z "$(git -C "$tmp/clone" status --porcelain)" ] || { echo "the clone of $commit is not clean" >&2; exit 1; }
echo "quick compare of $commit in $tmp/clone (load average: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
start=$(date +%s)
(cd "$tmp/clone" && PYTHONPATH="$tmp/clone" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  "$py" -c 'import sys; from posenc_lit.cli import main; sys.exit(main(sys.argv[1:]))' \
  compare --preset quick --out runs/compare-quick --quiet ${COMPARE_ARGS:-} > "$tmp/stdout.txt")
wall=$(( $(date +%s) - start ))
dest=$here/results/compare/quick
mkdir -p "$dest"
cp "$tmp/clone/runs/compare-quick/results.json" "$dest/results.json"
cp "$tmp/stdout.txt" "$dest/stdout.txt"
"$py" - "$dest/results.json" "$commit" "$wall" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
env = r['environment']
assert r['finished'] and env['git_commit'] == sys.argv[2] and env['git_dirty'] is False, (r['finished'], env)
print(f"{sys.argv[2][:12]}: {int(sys.argv[3])} s wall (the command), compute_s {r['compute_s']:.0f}, "
      f"{env['cpu_count']} × {env['cpu']}, {env['torch_threads']} threads", file=sys.stderr)
EOF
cd "$here"
PYTHONPATH=$here "$py" - <<'EOF'
import os
from execnb.nbio import read_nb, write_nb
from execnb.shell import CaptureShell
os.chdir('nbs')   # the notebook's paths are relative to its folder
nb = read_nb('index.ipynb')
sh = CaptureShell(mpl_format='png')
at = next(k for k, c in enumerate(nb.cells) if c.get('id') == '6c829d98')   # the sample
for c in nb.cells[:at]:   # the cells above it run (their outputs untouched): the imports and its helpers
    if c.cell_type == 'code':
        sh.run(c.source)
cell = nb.cells[at]
sh.cell(cell)
# execnb gives the printed text before the displayed Markdown; the cell displays the sentence first
cell.outputs = sorted(cell.outputs, key=lambda o: o.get('output_type') == 'stream')
assert not any(o.get('output_type') == 'error' for o in cell.outputs), cell.outputs
write_nb(nb, 'index.ipynb')
# the quick study's tables, times and figures in 30_compare (tests/test_compare.py checks the tables)
nb, sh = read_nb('30_compare.ipynb'), CaptureShell(mpl_format='png')
for i in ('d7847fd3', 'd8ee4555'):   # the imports
    sh.run(next(c for c in nb.cells if c.get('id') == i).source)
sh.run('from posenc_lit.compare import *')
for i in ('2e1949fd', 'b339f67f', '7dcf2d94', '5a44863b', '25c5c27b'):
    cell = next(c for c in nb.cells if c.get('id') == i)
    sh.cell(cell)
    assert not any(o.get('output_type') == 'error' for o in cell.outputs), (i, cell.outputs)
write_nb(nb, '30_compare.ipynb')
EOF
nbdev_clean --fname nbs/index.ipynb
nbdev_clean --fname nbs/30_compare.ipynb
"$py" tools/make_readme.py
PYTHONPATH=$here "$py" -m pytest -q tests/test_readme_sample.py
echo "now commit results/compare/quick nbs/index.ipynb nbs/30_compare.ipynb README.md (the README names $commit)" >&2
