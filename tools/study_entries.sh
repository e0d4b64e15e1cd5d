# shellcheck shell=bash
# The pretrain options of each study entry, shared by tools/run_reference.sh, tools/run_study.sh and
# tools/run_sweep.sh (study entry -> pretrain options; an encoding name alone runs that encoding with its defaults).
#
# Fair settings (issue 37; nbs/35_study.ipynb, "The entries"): every clipped relative table uses Shaw's paper's
# k = 16, which 32-token training blocks reach on both sides (offsets −31..31 clip to ±16), so no row is untrained by
# construction; huang4-k511 (k = max_position_embeddings − 1, HF's relative_key_query) is kept as the variant the
# longer-input claim needs. DeBERTa's headline entry has the same depth as every other entry: the Enhanced Mask Decoder
# (the last layer run again twice) is the ablation row deberta-emd, not part of `deberta`. The k512 entries are the
# settings of the first study (k = 512: rows past ±31 never trained), kept as recorded.
args_for() {
  case "$1" in
    huang4)                 echo '--pe huang4 --pe-kwargs {"k":16}' ;;
    huang4-k511)            echo '--pe huang4' ;;                                   # HF default k = 511
    sinusoidal-noscale)     echo '--pe sinusoidal --pe-kwargs {"scale_words":false}' ;;   # no √D on words
    tupe-a-tiecls)          echo '--pe tupe-a --pe-kwargs {"untie_cls":false}' ;;   # TUPE's tie-cls ablation
    deberta)                echo '--pe deberta --pe-kwargs {"k":16}' ;;             # c2p + p2c, same depth
    deberta-emd)            echo '--pe deberta --emd-steps 2 --pe-kwargs {"k":16}' ;;   # +EMD
    deberta-noc2p)          echo '--pe deberta --pe-kwargs {"k":16,"pos_att_type":["p2c"]}' ;;   # −C2P
    deberta-nop2c)          echo '--pe deberta --pe-kwargs {"k":16,"pos_att_type":["c2p"]}' ;;   # −P2C
    deberta-k512-emd)       echo '--pe deberta --emd-steps 2' ;;                    # first study's `deberta`
    deberta-k512)           echo '--pe deberta' ;;                                  # first study's −EMD
    deberta-k512-emd-noc2p) echo '--pe deberta --emd-steps 2 --pe-kwargs {"pos_att_type":["p2c"]}' ;;
    deberta-k512-emd-nop2c) echo '--pe deberta --emd-steps 2 --pe-kwargs {"pos_att_type":["c2p"]}' ;;
    *)                      echo "--pe $1" ;;
  esac
}
