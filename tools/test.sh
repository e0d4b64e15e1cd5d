#!/usr/bin/env bash
# The project's one test command:  bash tools/test.sh
# In order, stopping at the first failure:
#   1. notebooks clean     nbdev_clean, then no diff under nbs/
#   2. package in sync     nbdev_export, then no diff and no new untracked file under posenc_lit/
#   3. formatted           python tools/format_nbs.py --check: black at pyproject.toml's [tool.black] (110 characters)
#                          on the notebooks' exported cells (tests/test_style.py: no line over 120, ≤ 8 positional)
#   4. README in sync      python tools/make_readme.py --check
#   5. notebooks run       nbdev_test --n_workers 2 $NBDEV_TEST_FLAGS   (e.g. NBDEV_TEST_FLAGS="--flags slow")
#   6. tests/              python -m pytest -q -rs -n 2 --dist loadfile tests/ $PYTEST_FLAGS  (pytest-xdist;
#                          -rs prints the reason of every skipped test)
# Steps 1-2 compare the working tree with git's index/HEAD: in CI (a clean checkout) a diff means the committed
# notebooks were not cleaned or the package was not exported. Locally, commit (or stage) first, or set
# SKIP_GIT_CHECKS=1 to skip steps 1-2.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

fail() { echo; echo "FAIL: $*" >&2; exit 1; }
t_all=$SECONDS; t=$SECONDS
step() { echo; echo "== $*"; t=$SECONDS; }
done_() { echo "   ok ($((SECONDS - t)) s)"; }
for cmd in nbdev_clean nbdev_export nbdev_test python; do
  command -v "$cmd" >/dev/null || fail "$cmd not found: activate the venv and pip install -e '.[dev]'"
done

if [ "${SKIP_GIT_CHECKS:-0}" = 1 ]; then
  echo "== 1-2/6 skipped (SKIP_GIT_CHECKS=1)"
else
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || fail "not a git checkout: steps 1-2 need git (or set SKIP_GIT_CHECKS=1)"
  step "1/6 notebooks clean: nbdev_clean"
  nbdev_clean || fail "nbdev_clean crashed"
  git --no-pager diff --exit-code --stat -- nbs || fail "notebooks not clean: run nbdev_clean (the files above changed)"
  done_

  step "2/6 package in sync: nbdev_export"
  nbdev_export || fail "nbdev_export crashed (its traceback is above)"
  git --no-pager diff --exit-code --stat -- posenc_lit || fail "package out of sync: run nbdev_export and commit \
the files above"
  new=$(git ls-files --others --exclude-standard -- posenc_lit)
  [ -z "$new" ] || fail "package out of sync: run nbdev_export and add the new files: $new"
  done_
fi

step "3/6 formatted: tools/format_nbs.py --check"
python tools/format_nbs.py --check || fail "exported cells not formatted: run python tools/format_nbs.py NOTEBOOK (listed above)"
done_

step "4/6 README in sync: tools/make_readme.py --check"
python tools/make_readme.py --check || fail "README.md out of date: run python tools/make_readme.py"
done_

step "5/6 notebooks: nbdev_test --n_workers 2 ${NBDEV_TEST_FLAGS:-}"
# shellcheck disable=SC2086
# two notebooks run at once on 2 cores: one torch thread each (oversubscribed OpenMP threads are many times slower)
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} nbdev_test --n_workers 2 ${NBDEV_TEST_FLAGS:-} || fail "nbdev_test: a notebook failed (its traceback is above)"
done_

step "6/6 tests/: python -m pytest -q -rs -n 2 --dist loadfile tests/ ${PYTEST_FLAGS:-}"
# two pytest-xdist workers on 2 cores, one torch thread each, a test file per worker at a time (the JupyterLab tests
# share one server); the two workers share one docs build (tests/conftest.py site) and the two-process runs take free
# ports
# shellcheck disable=SC2086
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} python -m pytest -q -rs -n 2 --dist loadfile tests/ ${PYTEST_FLAGS:-} \
  || fail "pytest: tests/ failed (see above)"
done_

echo; echo "all checks passed in $((SECONDS - t_all)) s"
