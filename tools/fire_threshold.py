"""The learned threshold of a FIRE decoder run, for the page (42_decoder_study): whether the training made
L = |ℓ|·L_0 small enough that FIRE's normalization by max(L, i) acts at the lengths the study reads.

    python tools/fire_threshold.py RUN DEST     # RUN: runs/decoder/fire[-sK] (its checkpoint); writes DEST/fire.json

DEST/fire.json: {"L": [L of each MLP, tokens], "c": [...], "init_L": L_0, "seq_len": the training length}.
"""

import json, sys
from pathlib import Path

from safetensors.torch import load_file


def main(run: str, dest: str) -> dict:
    run, dest = Path(run), Path(dest)
    weights = load_file(run / 'checkpoint' / 'model.safetensors')
    init_L = float(weights['pe.init_L'])
    out = {
        'L': [round(abs(float(s)) * init_L, 3) for s in weights['pe.L_scale']],
        'c': [round(float(c), 4) for c in weights['pe.c']],
        'init_L': init_L,
        'seq_len': json.loads((run / 'config.json').read_text())['seq_len'],
    }
    (dest / 'fire.json').write_text(json.dumps(out, indent=1) + '\n')
    return out


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(main(*sys.argv[1:]))
