# shellcheck shell=bash
# What the study lanes share: sourced by tools/run_study.sh, run_order.sh, run_decoder_study.sh,
# run_vit_study.sh and refit_study.sh.

# commit_result MESSAGE PATH...: commit one finished result (its paths in one commit), retrying while another
# git command holds the index (COMMIT=0: commit nothing)
commit_result() {
  [ "${COMMIT:-1}" = 1 ] || return 0
  local message=$1
  shift
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    if git add "$@" && git commit -q -m "$message" -- "$@"; then return 0; fi
    sleep 7
  done
  echo "warning: could not commit $*" >&2
}

# check_names SCRIPT KNOWN NAME...: every NAME is an entry of KNOWN (a space-separated list) or ENTRY-sK,
# seed K of an entry (K > 0 without a leading zero: seed 0 is the plain name; K below 2**32, the CLI's
# largest seed), and holds no whitespace; otherwise a message naming SCRIPT and the name on stderr, and
# status 2. A lane calls it before its first run starts (a run takes most of an hour).
check_names() {
  local script=$1 known=$2 name entry seed first second
  shift 2
  read -r first second _ <<< "$known"
  for name in "$@"; do
    if [[ $name =~ [[:space:]] ]]; then
      echo "$script: the name '$name' holds whitespace; nothing was run. Pass each study entry as its own" \
        "argument (e.g. $first $second, not '$first $second')" >&2
      return 2
    fi
    entry=$name
    if [[ $name =~ ^(.+)-s([1-9][0-9]*)$ ]]; then
      entry=${BASH_REMATCH[1]} seed=${BASH_REMATCH[2]}
      # the CLI takes seeds below 2**32; more than 10 digits would overflow bash's arithmetic
      if (( ${#seed} > 10 )) || (( seed >= 4294967296 )); then
        echo "$script: the seed of '$name' is past the largest seed, 4294967295 (2**32 - 1);" \
          "nothing was run" >&2
        return 2
      fi
    fi
    if [[ " $known " != *" $entry "* ]]; then
      echo "$script: unknown study entry '$name'; nothing was run. Known entries: $known" \
        "(seed k > 0 of an entry: ENTRY-sk, e.g. $first-s1)" >&2
      return 2
    fi
  done
}

# split_name NAME: sets `entry` and `seed` of a name check_names accepted (ENTRY-sK: ENTRY and K; else seed 0)
split_name() {
  entry=$1 seed=0
  if [[ $1 =~ ^(.+)-s([1-9][0-9]*)$ ]]; then entry=${BASH_REMATCH[1]} seed=${BASH_REMATCH[2]}; fi
}
