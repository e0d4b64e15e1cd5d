#!/usr/bin/env python
"""Format the exported cells of the notebooks with black, at the settings of pyproject.toml's [tool.black].

    python tools/format_nbs.py [NOTEBOOK ...]           format in place (default: every nbs/*.ipynb nbdev exports)
    python tools/format_nbs.py --check [NOTEBOOK ...]   change nothing; list the cells black would change, exit 1

Why not nbdev's own formatter (settings.ini `black_formatting = True`): nbdev 2.4.14's `black_format` processor
calls `black.format_str(..., mode=black.Mode())`, black's defaults (line length 88), and never reads
pyproject.toml; and it formats only the copy it writes, so the notebook a reader sees would differ from the
module. Formatting the notebooks' exported cells (`#| export`, `#| exports`, `#| exporti`) instead keeps the
package equal to the notebooks (test step 2) and formatted at our line length (checked by step 3 of
tools/test.sh). The directive lines stay as they are; the code below them is what nbdev writes to the module.
Black cannot split long strings, comments or docstrings: tests/test_style.py catches those lines (> 120).
"""

import argparse
import json
import sys
import tomllib
from pathlib import Path

import black
from fastcore.basics import AttrDict
from nbdev.process import extract_directives, first_code_ln

ROOT = Path(__file__).resolve().parent.parent
EXPORTS = {'export', 'exports', 'exporti'}


def black_mode() -> black.Mode:
    "black's mode from pyproject.toml [tool.black] (line-length, skip-string-normalization, target-version)"
    cfg = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['black']
    versions = {black.TargetVersion[v.upper()] for v in cfg.get('target-version', [])}
    return black.Mode(
        line_length=cfg['line-length'],
        string_normalization=not cfg.get('skip-string-normalization', False),
        target_versions=versions,
    )


def format_cell(source: str, mode: black.Mode) -> str:
    "`source` with its code (the lines after the leading directives) formatted by black; directives unchanged"
    lines = source.splitlines(True)
    first = first_code_ln(lines)
    if first is None:
        return source
    head = ''.join(lines[:first])
    code = ''.join(lines[first:])
    try:
        new = black.format_file_contents(code, fast=False, mode=mode)
    except black.NothingChanged:
        return source
    return head + new.rstrip('\n')


def is_exported(cell: dict) -> bool:
    "True for a code cell that nbdev writes to the package"
    if cell['cell_type'] != 'code':
        return False
    directives = extract_directives(AttrDict(source=''.join(cell['source'])), remove=False)
    return bool(EXPORTS & set(directives))


def format_notebook(path: Path, mode: black.Mode, check: bool) -> list[str]:
    "Format the exported cells of `path` (unless `check`); return the ids of the cells that were (or would be) changed"
    nb = json.loads(path.read_text())
    changed = []
    for cell in nb['cells']:
        if not is_exported(cell):
            continue
        old = ''.join(cell['source'])
        try:
            new = format_cell(old, mode)
        except black.InvalidInput as e:
            raise SystemExit(f'{path.name}, cell {cell.get("id")}: black cannot parse it: {e}')
        if new != old:
            changed.append(cell.get('id', '?'))
            cell['source'] = new.splitlines(True)
    if changed and not check:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    return changed


# notebooks not formatted yet (issue 25 item 5); the check skips them until they are (tests/test_style.py lists
# their modules as expected failures)
PENDING = set()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        'notebooks', nargs='*', type=Path, help='default: nbs/*.ipynb (not those starting with _ or .)'
    )
    ap.add_argument('--check', action='store_true', help='change nothing; exit 1 if a cell would change')
    args = ap.parse_args(argv)
    paths = args.notebooks or sorted(p for p in (ROOT / 'nbs').glob('*.ipynb')
                                     if p.name[0] not in '_.' and p.stem not in PENDING)
    mode = black_mode()
    bad = 0
    for path in paths:
        changed = format_notebook(path, mode, args.check)
        if changed:
            bad += 1
            verb = 'would reformat' if args.check else 'reformatted'
            print(f'{verb} {path.name}: {len(changed)} cell(s): {" ".join(changed)}')
    if args.check and bad:
        print(
            f'{bad} notebook(s) not formatted: run python tools/format_nbs.py NOTEBOOK, then nbdev_clean and '
            'nbdev_export',
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
