#!/usr/bin/env bash
# Build the docs site offline, without Quarto, into _site/:
#   1. nbdev 2's own docs processing (what `nbdev_proc_nbs` does) into _proc/
#   2. `smalldocs render _proc` (reads nbs/_quarto.yml, nbdev.yml, sidebar.yml)
#   3. tools/docs_postprocess.py: KaTeX from docs_assets/katex/ (vendored) instead of the CDN, so equations
#      render offline, and nbdev's doc links to the published site pointed at the local pages.
# Usage: bash tools/build_docs.sh          (then: python -m http.server -d _site)
# Env:   DOCS_WORKERS (default 2) -- processes for the notebook processing step.
# With Quarto installed, `nbdev_docs` / `nbdev_preview` build the Quarto site instead (into _docs/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python}

fail() { echo "build_docs: $*" >&2; exit 1; }
command -v smalldocs >/dev/null || fail "smalldocs is not installed: pip install -e '.[dev]' (or pip install smalldocs)"
[ -f docs_assets/katex/katex.min.js ] || fail "docs_assets/katex/ is missing: the vendored KaTeX is part of the repo"

t0=$SECONDS
echo "== 1/3 nbdev: process notebooks into _proc/"
rm -rf _proc _site
# `nbdev_proc_nbs` in nbdev 2.4.14 first calls `_ensure_quarto()`, which tries to download and `sudo` install
# Quarto when it is missing, then rebuilds posenc_lit/_modidx.py (while the other pytest worker may be reading
# the package). The rest is what we want (refresh nbdev.yml, the sidebar step -- a no-op with custom_sidebar =
# True -- then `proc_nbs`), so run it with both off: the docs read the _modidx.py that nbdev_export wrote (test.sh
# step 2 checks it is in sync).
# (python -c, not a heredoc: proc_nbs uses spawned workers, which must be able to re-import __main__)
"$PY" -c '
import sys
import nbdev.doclinks, nbdev.quarto as q
q._ensure_quarto = lambda: None   # no Quarto here, and we do not want it installed
nbdev.doclinks._build_modidx = lambda *a, **k: None   # the docs build never writes the package
q.nbdev_proc_nbs.__wrapped__(n_workers=int(sys.argv[1]))
' "${DOCS_WORKERS:-2}" || fail "notebook processing failed (see the traceback above). A ModuleNotFoundError: install
the development extras, pip install -e '.[dev]' (the notebooks import transformers, timm and more). A NameError:
nbdev's docs step runs every cell that contains an \`import\` or \`#| export\` (to render show_doc), without the
cells before it that do not, so such a cell must not need variables made by other cells -- move the import up
into an import cell"
[ -f _proc/_quarto.yml ] || fail "_proc/_quarto.yml was not written: is nbs/_quarto.yml there?"
t1=$SECONDS

echo "== 2/3 smalldocs: render _proc/ into _site/"
# Warnings smalldocs gives for every nbdev project (Quarto-only keys; nbdev's `output-file` page names) are
# filtered out; any other warning (a broken link, say) is shown.
known='output-file is not read by smalldocs|format commonmark is not built|keep-md is ignored|html-math-method is ignored'
smalldocs render _proc 2>&1 | { grep -v -E "$known" || true; }
[ "${PIPESTATUS[0]}" = 0 ] || fail "smalldocs render failed"
# nbs/nbdev.yml sets output-dir: _docs (the Quarto convention); the offline site goes to _site/ instead
[ -d _proc/_docs ] || fail "smalldocs wrote no _proc/_docs/: check output-dir in nbs/nbdev.yml"
mv _proc/_docs _site
t2=$SECONDS

echo "== 3/3 post-process: vendored KaTeX (site_libs/katex/) instead of the CDN, doc links to local pages"
"$PY" tools/docs_postprocess.py || fail "post-processing _site/ failed"
t3=$SECONDS
pages=$(find _site -name '*.html' | wc -l)
echo "built $pages pages into _site/ in $((t3 - t0)) s (process $((t1 - t0)) s, render $((t2 - t1)) s, post-process $((t3 - t2)) s)"
echo "view: python -m http.server -d _site   (then open http://localhost:8000)"
