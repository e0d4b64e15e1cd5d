"""Save the trained position table of a ViT run for the vit_study notebook (40_vit_study): `pos_embed.safetensors` in
OUT holds `table`, float32 `(1, n, D)` (the [CLS] row, then the patches in reading order), for an encoding with a learned
table; nothing is written for one without (sincos2d, rope2d, rel2d, none). The trained model is `RUN/trained_model`
when the run fine-tuned from it several times (`finetune_init`), else `RUN/checkpoint/model`.
Usage: python tools/vit_pos_table.py RUN OUT"""
import sys
from pathlib import Path
from safetensors.torch import save_file
from posenc_lit.vit import load_vit

run, out = Path(sys.argv[1]), Path(sys.argv[2])
m = load_vit(run / 'trained_model' if (run / 'trained_model').is_dir() else run / 'checkpoint' / 'model')
if m.pe.table_grid is None: raise SystemExit(0)
grid = m.pe.table_grid
save_file({'table': m.pe.embed_grid(grid).detach().float().contiguous()}, out / 'pos_embed.safetensors',
          metadata={'grid': f'{grid[0]}x{grid[1]}', 'pe': m.cfg.pe, 'num_prefix_tokens': str(m.cfg.num_prefix_tokens)})
print(f'{out}/pos_embed.safetensors: {m.cfg.pe} table for the {grid[0]}×{grid[1]} grid')
