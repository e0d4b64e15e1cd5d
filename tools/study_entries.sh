# shellcheck shell=bash
# The pretrain options of each study entry, shared by tools/run_reference.sh, tools/run_study.sh and
# tools/run_sweep.sh (study entry -> pretrain options; any other name runs that encoding with its defaults).
#
# The options come from one place, posenc_lit.study.entry_args (nbs/35_study.ipynb, "The options of each entry"):
# the registry's defaults of each encoding for the study preset and its ablations (register_encoding), and the
# study's own variants (STUDY_VARIANTS). Fair settings (issue 37; nbs/35_study.ipynb, "The entries"): every clipped
# relative table uses Shaw's paper's k = 16, which 32-token training blocks reach on both sides (offsets −31..31 clip
# to ±16), so no row is untrained by construction; huang4-k511 (k = max_position_embeddings − 1, HF's
# relative_key_query) is kept as the variant the longer-input claim needs. DeBERTa's headline entry has the same depth
# as every other entry: the Enhanced Mask Decoder (the last layer run again twice) is the ablation row deberta-emd,
# not part of `deberta`. The k512 entries are the settings of the first study (k = 512: rows past ±31 never trained),
# kept as recorded.
#
# The package is imported from the checkout this file is in (the code may be a frozen copy of the repository).
_STUDY_ENTRIES_CODE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# args_for ENTRY: one line, e.g. `--pe deberta --emd-steps 2 --pe-kwargs {"k":16}`. If the options cannot be read,
# an error on stderr and `--pe args_for-failed`, an encoding that `posenc_lit pretrain` refuses: no run starts
# without its options.
args_for() {
  local out
  if ! out=$(PYTHONPATH="$_STUDY_ENTRIES_CODE${PYTHONPATH:+:$PYTHONPATH}" python -c \
    'import sys; from posenc_lit.study import entry_args; print(*entry_args(sys.argv[1]))' "$1"); then
    echo "args_for: cannot read the options of study entry '$1' (posenc_lit.study.entry_args)" >&2
    echo '--pe args_for-failed'
    return 1
  fi
  echo "$out"
}
