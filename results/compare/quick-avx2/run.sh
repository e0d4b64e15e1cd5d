#!/usr/bin/env bash
# The quick preset's none and shaw on AVX2 kernels (ATen and MKL), emulating a CPU without AVX-512 (issue 38):
# run in a clean clone of the sample's commit (637d6ad692a4), 2 threads, beside other jobs (its times are not
# comparable; its numbers are); results/compare/quick-avx2
cd /work/qavx2
. /work/venv/bin/activate
export OMP_NUM_THREADS=2 PYTHONPATH=/work/qavx2 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
python -c 'import sys; from posenc_lit.cli import main; sys.exit(main(sys.argv[1:]))' compare --preset quick \
  --encodings none shaw --out runs/compare-quick-avx2 --quiet > /work/scratch/avx2_stdout.txt 2> /work/scratch/avx2_stderr.txt
echo "rc $?" >> /work/scratch/avx2_stderr.txt
