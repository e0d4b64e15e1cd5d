# shellcheck shell=bash
# What the study lanes share: sourced by tools/run_study.sh and tools/run_decoder_study.sh.

# commit_result PATH MESSAGE: commit one finished result, retrying while another git command holds the index
# (COMMIT=0: commit nothing)
commit_result() {
  [ "${COMMIT:-1}" = 1 ] || return 0
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    if git add "$1" && git commit -q -m "$2" -- "$1"; then return 0; fi
    sleep 7
  done
  echo "warning: could not commit $1" >&2
}
