#!/usr/bin/env python
"""Post-process the smalldocs site in _site/ (called by tools/build_docs.sh, from the repository root).

1. smalldocs 0.5.4 loads KaTeX from a CDN and has no option for its URL: point every page at the vendored copy
   in `_site/site_libs/katex/` (copied from `docs_assets/katex/`), so equations render offline.
2. nbdev's doc links (backticked symbols) go to the published Quarto site, where `00_core.ipynb` becomes
   `core.html` (nbdev's `output-file`); smalldocs names it `00_core.html`. Point them at the local page.
3. nbdev links every backticked name its index knows, private ones (`_setup`) too, but only public names get an
   API entry to land on: unwrap links to a private name's `#anchor` that its page does not have (the code stays).
4. The theme's CSS (bootswatch cosmo) imports its web font from Google Fonts: drop the import, so that no page
   asks the network for anything (the theme's font stack falls back to the system's sans-serif). Then check that
   no page, stylesheet or script of the site loads anything from outside it.
5. Links into the project's repository (settings.ini `git_url`) lead nowhere while it is not public: nbdev's
   "source" link of each API entry and the navbar's repository icon are dropped, the "Report an issue" action
   too, and any other link into the repository keeps its text without the link. (A Quarto build published with
   a public repository, .github/workflows/deploy.yaml, keeps them: there they resolve.)
6. Figures are numbered as Quarto numbers them: a cell labelled `fig-...` (`#| label: fig-...`) is the page's
   next figure, and its caption starts "Figure N: " (N a, N b, ... when the cell shows several pictures).
"""
import configparser, json, posixpath, re, shutil, sys
from pathlib import Path

import yaml

SITE, PROC, KATEX = Path('_site'), Path('_proc'), Path('docs_assets/katex')
CDN = re.compile(r'https?://cdn\.jsdelivr\.net/npm/katex@[^/"\']+/dist')
CSS_IMPORT = re.compile(r'@import\s+url\(\s*["\']?(?:https?:)?//[^)]*\)\s*;?')   # a remote @import (the theme's web font)
PRIVATE_LINK = re.compile(r'<a href="([^"#]*)#(_[^"]*)"[^>]*>(<code>[^<]*</code>)</a>')   # nbdev's link to `_name`
SOURCE_LINK = r'<p><a href="{git}/blob/[^"]*"[^>]*>source</a></p>\n?'   # nbdev's show_doc "source" link
REPO_ICON = r'<li class="nav-item[^"]*">\s*<a class="nav-link" href="{git}/?"[^>]*>.*?</a>\s*</li>'
ISSUE_ACTION = r'<div class="action-links">\s*<a href="{git}/issues[^"]*"[^>]*>.*?</a>\s*</div>'
REMOTE_LOAD = {'.html': re.compile(r'<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=["\'](?:https?:)?//[^"\']+', re.I),
               '.css': re.compile(r'(?:@import|url\()\s*["\']?(?:https?:)?//[^)"\'\s]+', re.I)}


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


def unwrap_private_links():
    "Replace nbdev's links to private names whose anchor is not on the target page by their `<code>`; returns how many."
    pages = {p: p.read_text(encoding='utf-8') for p in SITE.rglob('*.html')}
    ids = {p.resolve(): set(re.findall(r'\bid="([^"]+)"', t)) for p, t in pages.items()}
    n = 0
    for page, text in pages.items():
        def unwrap(m):
            nonlocal n
            target = (page.parent / m.group(1)).resolve() if m.group(1) else page.resolve()
            known = ids.get(target)
            if known is None or m.group(2) in known: return m.group(0)
            n += 1
            return m.group(3)
        new = PRIVATE_LINK.sub(unwrap, text)
        if new != text: page.write_text(new, encoding='utf-8')
    return n


FIG_CELL = re.compile(r'<div\b[^>]*\bid="(fig-[^"]+)"[^>]*>')
NEXT_CELL = re.compile(r'<div\b[^>]*\bclass="cell[" ]')   # a cell, not its cell-output


def number_figures(text):
    "`text` with the captions of its `fig-` cells numbered in page order, as Quarto's cross-references do."
    out, pos, n = [], 0, 0
    for m in FIG_CELL.finditer(text):
        if m.start() < pos:
            continue
        nxt = NEXT_CELL.search(text, m.end())
        end = nxt.start() if nxt else len(text)
        cell = text[m.start():end]
        caps = cell.count('<figcaption>')
        if not caps:
            continue
        n += 1
        letters = iter('abcdefghijklmnopqrstuvwxyz')
        tag = lambda _: f'<figcaption>Figure {n}{" " + next(letters) if caps > 1 else ""}: '
        out.append(text[pos:m.start()] + re.sub('<figcaption>', tag, cell))
        pos = end
    return ''.join(out) + text[pos:], n


def drop_repo_links(text, git):
    "`text` without links into repository `git`: source links, icon, issue action dropped; others unwrapped."
    g = re.escape(git.rstrip('/'))
    for rx in (SOURCE_LINK, REPO_ICON, ISSUE_ACTION):
        text = re.sub(rx.format(git=g), '', text, flags=re.S)
    return re.sub(f'<a\\b[^>]*\\bhref="{g}(?:/[^"]*)?"[^>]*>(.*?)</a>', r'\1', text, flags=re.S)


def main():
    if not SITE.is_dir(): sys.exit('no _site/: run smalldocs first')
    dst = SITE / 'site_libs' / 'katex'
    if dst.exists(): shutil.rmtree(dst)
    shutil.copytree(KATEX, dst, ignore=shutil.ignore_patterns('*.md'))
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read('settings.ini', encoding='utf-8')
    host = (cfg['DEFAULT'].get('doc_host', '') + cfg['DEFAULT'].get('doc_baseurl', '')).rstrip('/')
    git = cfg['DEFAULT'].get('git_url', '').rstrip('/')
    names = quarto_names()
    names[''] = 'index.html'                                   # the site's root: its home page
    links = re.compile(re.escape(host) + r'/([^"\'#?\s]+\.html|(?=["\'#]))') if host else None
    n_math = n_links = n_repo = n_figs = 0
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
        if git:
            new = drop_repo_links(text, git)
            n_repo += new != text
            text = new
        text, k = number_figures(text)
        n_figs += k
        if text != orig: page.write_text(text, encoding='utf-8')
    n_private = unwrap_private_links()
    n_css = 0
    for css in SITE.rglob('*.css'):
        text = css.read_text(encoding='utf-8')
        if CSS_IMPORT.search(text):
            css.write_text(CSS_IMPORT.sub('', text), encoding='utf-8'); n_css += 1
    left = [p.as_posix() for p in SITE.rglob('*.html') if 'cdn.jsdelivr.net/npm/katex' in p.read_text(encoding='utf-8')]
    if left: sys.exit(f'pages still load KaTeX from the CDN: {left}')
    remote = [f'{p.relative_to(SITE)}: {m.group(0)[:120]}' for ext, rx in REMOTE_LOAD.items() for p in SITE.rglob('*' + ext)
              for m in rx.finditer(re.sub(r'data:[^"\'\s)]*', '', p.read_text(encoding='utf-8')))]
    if remote: sys.exit('the site still loads from outside itself:\n  ' + '\n  '.join(remote[:20]))
    print(f'   {n_math} page(s) with maths load site_libs/katex/; doc links made local in {n_links} page(s); '
          f'links into the repository dropped from {n_repo} page(s); {n_figs} figure(s) numbered; '
          f'{n_private} link(s) to private names without an entry unwrapped; remote font imports dropped from {n_css} stylesheet(s)')


if __name__ == '__main__': main()
