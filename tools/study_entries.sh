# shellcheck shell=bash
# The pretrain options of each study entry, shared by tools/run_reference.sh and tools/run_study.sh.
# study entry -> pretrain options (an encoding name alone runs that encoding with its defaults)
args_for() {
  case "$1" in
    tupe-a-tiecls)  echo "--pe tupe-a --pe-kwargs {\"untie_cls\":false}" ;;        # TUPE's tie-cls ablation
    deberta)        echo "--pe deberta --emd-steps 2" ;;                            # DeBERTa: c2p + p2c + EMD
    deberta-noemd)  echo "--pe deberta" ;;                                          # −EMD
    deberta-noc2p)  echo "--pe deberta --emd-steps 2 --pe-kwargs {\"pos_att_type\":[\"p2c\"]}" ;;   # −C2P
    deberta-nop2c)  echo "--pe deberta --emd-steps 2 --pe-kwargs {\"pos_att_type\":[\"c2p\"]}" ;;   # −P2C
    *)              echo "--pe $1" ;;
  esac
}
