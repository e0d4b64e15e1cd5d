#!/usr/bin/env python
"""Put the version and the commit on every page of the docs site, so that a reader can cite what they read.

A post-render script (nbs/_quarto.yml `project: post-render`), run by Quarto (`nbdev_docs`, the deploy
workflow) and by smalldocs (`tools/build_docs.sh`) after the pages are written: every `.html` page under the
output folder (`QUARTO_PROJECT_OUTPUT_DIR`, relative to the project folder, or the folder given as the first
argument) gets a footer line `posenc_lit 0.1.0 · commit 1a2b3c4 · how to cite` before `</body>`. The version
is settings.ini's `version`; the commit is `git rev-parse --short HEAD` at build time, with `-dirty` when the
working tree has changes to tracked files, or `unknown` outside a git checkout. Running it again replaces the
line it wrote.
"""

import configparser, html, os, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = 'posenc-version'  # the footer's class: how a second run finds the line the first one wrote
OLD = re.compile(rf'<footer class="{MARK}".*?</footer>\n?', re.S)


def version() -> str:
    "settings.ini's `version`."
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT / 'settings.ini', encoding='utf-8')
    return cfg['DEFAULT']['version']


def commit() -> str:
    "The short commit of the checkout, `-dirty` when tracked files have changed; `unknown` without git."
    git = lambda *a: subprocess.run(['git', '-C', str(ROOT), *a], capture_output=True, text=True, timeout=30)
    try:
        head = git('rev-parse', '--short', 'HEAD')
        dirty = git('status', '--porcelain', '--untracked-files=no')
    except (OSError, subprocess.TimeoutExpired):
        return 'unknown'
    if head.returncode:
        return 'unknown'
    return head.stdout.strip() + ('-dirty' if dirty.stdout.strip() else '')


def footer(ver: str, sha: str, cite_href: str) -> str:
    "The footer's HTML."
    text = f'posenc_lit {html.escape(ver)} · commit <code>{html.escape(sha)}</code>'
    return (
        f'<footer class="{MARK}" style="text-align:center; font-size:smaller; padding:0.5rem 0">{text}'
        f' · <a href="{cite_href}">how to cite</a></footer>\n'
    )


def stamp(out: Path) -> int:
    "Write the footer into every page under `out`; returns how many pages."
    if not out.is_dir():
        sys.exit(f'docs_footer: no output folder {out}')
    ver, sha, n = version(), commit(), 0
    for page in sorted(out.rglob('*.html')):
        text = OLD.sub('', page.read_text(encoding='utf-8'))
        if '</body>' not in text:
            continue
        home = os.path.relpath(out / 'index.html', page.parent).replace(os.sep, '/')
        new = text.replace('</body>', footer(ver, sha, home + '#citing') + '</body>', 1)
        page.write_text(new, encoding='utf-8')
        n += 1
    return n


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('QUARTO_PROJECT_OUTPUT_DIR')
    if not out:
        sys.exit(
            'docs_footer: give the output folder (or run as a post-render script: QUARTO_PROJECT_OUTPUT_DIR)'
        )
    n = stamp(Path(out).resolve())
    print(f'   docs_footer: posenc_lit {version()}, commit {commit()} on {n} page(s)')


if __name__ == '__main__':
    main()
