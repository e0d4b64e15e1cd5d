#!/usr/bin/env python
"""Post-process the smalldocs site in _site/ (called by tools/build_docs.sh, from the repository root).

1. smalldocs 0.5.4 loads KaTeX from a CDN and has no option for its URL: point every page at the vendored copy
   in `_site/site_libs/katex/` (copied from `docs_assets/katex/`), so equations render offline.
2. nbdev's doc links (backticked symbols) go to the published Quarto site, where `00_core.ipynb` becomes
   `core.html` (nbdev's `output-file`); smalldocs names it `00_core.html`. Point them at the local page.
"""
import configparser, json, posixpath, re, shutil, sys
from pathlib import Path

import yaml

SITE, PROC, KATEX = Path('_site'), Path('_proc'), Path('docs_assets/katex')
CDN = re.compile(r'https?://cdn\.jsdelivr\.net/npm/katex@[^/"\']+/dist')


def quarto_names():
    "{Quarto page (output-file) -> smalldocs page}, from the front matter nbdev wrote into _proc/."
    names = {}
    for nb in PROC.rglob('*.ipynb'):
        cells = json.loads(nb.read_text(encoding='utf-8')).get('cells', [])
        src = ''.join(cells[0]['source']) if cells and cells[0]['cell_type'] == 'raw' else ''
        m = re.match(r'^---\n(.*?)\n---', src, re.S)
        out = (yaml.safe_load(m.group(1)) or {}).get('output-file') if m else None
        rel = nb.relative_to(PROC)
        if out: names[(rel.parent / out).as_posix()] = rel.with_suffix('.html').as_posix()
    return names


def main():
    if not SITE.is_dir(): sys.exit('no _site/: run smalldocs first')
    dst = SITE / 'site_libs' / 'katex'
    if dst.exists(): shutil.rmtree(dst)
    shutil.copytree(KATEX, dst, ignore=shutil.ignore_patterns('*.md'))
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read('settings.ini', encoding='utf-8')
    host = (cfg['DEFAULT'].get('doc_host', '') + cfg['DEFAULT'].get('doc_baseurl', '')).rstrip('/')
    names = quarto_names()
    links = re.compile(re.escape(host) + r'/([^"\'#?\s]+\.html)') if host else None
    n_math = n_links = 0
    for page in SITE.rglob('*.html'):
        text = orig = page.read_text(encoding='utf-8')
        here = page.parent.relative_to(SITE).as_posix() or '.'
        if CDN.search(text):
            text = CDN.sub(posixpath.relpath('site_libs/katex', here), text)
            n_math += 1
        if links:
            new = links.sub(lambda m: posixpath.relpath(names[m.group(1)], here) if m.group(1) in names else m.group(0), text)
            n_links += new != text
            text = new
        if text != orig: page.write_text(text, encoding='utf-8')
    left = [p.as_posix() for p in SITE.rglob('*.html') if 'cdn.jsdelivr.net/npm/katex' in p.read_text(encoding='utf-8')]
    if left: sys.exit(f'pages still load KaTeX from the CDN: {left}')
    print(f'   {n_math} page(s) with maths load site_libs/katex/; doc links made local in {n_links} page(s)')


if __name__ == '__main__': main()
