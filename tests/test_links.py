"""Links into the project that resolve, and what makes the project citable.

The project has no public repository or published site yet (settings.ini `git_url`, `doc_host` +
`doc_baseurl` name where they will be). So: the README links to files of the checkout; the notebooks link to
pages that a notebook makes and to files that exist; the offline site (`tools/build_docs.sh`) keeps no link
into the repository or the site, and each of its local links and anchors resolves. Links to papers and other
projects are not checked.
Every page shows the version and the commit; `CITATION.cff` agrees with settings.ini.
"""

import configparser, html, importlib.util, json, re, subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from conftest import NBS, ROOT, notebooks, quarto_pages

MD_LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
HREF = re.compile(r'\b(?:href|src)\s*=\s*"([^"]*)"', re.I)
SPDX = {'apache2': 'Apache-2.0', 'mit': 'MIT', 'bsd3': 'BSD-3-Clause', 'gpl3': 'GPL-3.0-only'}


def settings():
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT / 'settings.ini', encoding='utf-8')
    return cfg['DEFAULT']


def own_prefixes():
    "The project's repository (git_url) and site (doc_host + doc_baseurl), without trailing slash."
    s = settings()
    return s['git_url'].rstrip('/'), (s['doc_host'] + s['doc_baseurl']).rstrip('/')


def tool(name):
    "A module of tools/ (they are scripts, not a package)."
    spec = importlib.util.spec_from_file_location(name, ROOT / 'tools' / f'{name}.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gh_slug(heading):
    "The anchor a repository host gives a Markdown heading."
    s = re.sub(r'[^\w\- ]', '', heading.strip().lower())
    return s.replace(' ', '-')


def outside_code(md):
    "Markdown without fenced code blocks and inline code (links in code are not links)."
    md = re.sub(r'^```.*?^```', '', md, flags=re.S | re.M)
    return re.sub(r'`[^`\n]*`', '', md)


# ----------------------------------------------------------------------------------------------------
# The README, read from a checkout


def test_readme_links_resolve():
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    git, site = own_prefixes()
    anchors = {gh_slug(h) for h in re.findall(r'^#{1,6}\s+(.+?)\s*$', outside_code(readme), re.M)}
    links = MD_LINK.findall(outside_code(readme))
    assert len(links) > 20, f'only {len(links)} links found in README.md: is the pattern still right?'
    bad = []
    for url in links:
        if url.startswith((git, site)):
            bad.append(
                f'{url}: into the project\'s repository or site, which are not published; link the file '
                f'of the checkout (nbs/NN_name.ipynb, a path)'
            )
        elif url.startswith('#'):
            if url[1:] not in anchors:
                bad.append(f'{url}: no such heading in README.md')
        elif not urlsplit(url).scheme and not (ROOT / unquote(url.split('#')[0])).exists():
            bad.append(f'{url}: no such file in the checkout')
    assert not bad, 'README.md links that do not resolve:\n  ' + '\n  '.join(bad)


def test_readme_relink():
    "tools/make_readme.py rewrites links to the site, repository and notebooks into paths of the checkout."
    mr, s = tool('make_readme'), settings()
    git, site = own_prefixes()
    md = (
        f'[a]({site}/tupe.html#eq "t") [b]({site}/core.html) [c](08_deberta.ipynb#x) '
        f'[d]({git}/blob/main/setup.py) '
        f'[e](https://arxiv.org/abs/2006.15595) [f](#the-encodings)'
    )
    want = (
        '[a](nbs/07_tupe.ipynb "t") [b](nbs/00_core.ipynb) [c](nbs/08_deberta.ipynb) [d](setup.py) '
        '[e](https://arxiv.org/abs/2006.15595) [f](#the-encodings)'
    )
    assert mr.relink(md, s, NBS) == want
    with pytest.raises(ValueError, match='no notebook makes the page'):
        mr.relink(f'[x]({site}/no_such_page.html)', s, NBS)


def test_readme_prints_a_loop_as_one_block(tmp_path):
    """A cell that prints in a loop is stored as one stream output per flush; tools/make_readme.py shows
    them as one output block, not one block per line with blank lines between (the Quickstart's loop)."""
    import nbformat
    mr = tool('make_readme')
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('for s in (10, 20):\n    print(s)')
    cell.outputs = [nbformat.v4.new_output('stream', name='stdout', text=f'step {s}\n') for s in (10, 20)]
    nb.cells = [nbformat.v4.new_markdown_cell('# T\n> d'), cell]
    f = tmp_path / 'index.ipynb'
    nbformat.write(nb, f)
    mr.ROOT = tmp_path  # render names the notebook relative to the repository root
    text, _ = mr.render(f, 'index_files')
    assert '    step 10\n    step 20\n' in text, text


# ----------------------------------------------------------------------------------------------------
# The notebooks: what a Quarto build published from this source would link to


def test_notebook_links_into_project_resolve():
    "Notebook links into the site name a page that some notebook makes; into the repository, a file."
    git, site = own_prefixes()
    branch = settings().get('branch', 'main')
    pages = set(quarto_pages()) | {'', 'index.html'}
    files = {nb.relative_to(NBS).as_posix() for nb in notebooks()}
    bad, n = [], 0
    for nb in notebooks():
        cells = json.loads(nb.read_text(encoding='utf-8'))['cells']
        for c in cells:
            if c['cell_type'] != 'markdown':
                continue
            for url in MD_LINK.findall(outside_code(''.join(c['source']))):
                path = unquote(url.split('#')[0])
                if url.startswith(site + '/'):
                    n += 1
                    if path[len(site) + 1 :] not in pages:
                        bad.append(f'{nb.name}: {url}: no notebook makes this page')
                elif url.startswith(git):
                    n += 1
                    rel = path[len(git) :].lstrip('/')
                    if (
                        not rel.startswith(f'blob/{branch}/')
                        or not (ROOT / rel[len(f'blob/{branch}/') :]).exists()
                    ):
                        bad.append(f'{nb.name}: {url}: not a file of the checkout on branch {branch}')
                elif not urlsplit(url).scheme and path.endswith('.ipynb'):
                    n += 1
                    if (nb.parent / path).resolve().relative_to(NBS).as_posix() not in files:
                        bad.append(f'{nb.name}: {url}: no such notebook')
    assert n, 'no link into the project found in the notebooks'
    assert not bad, 'links into the project that do not resolve:\n  ' + '\n  '.join(bad)


# ----------------------------------------------------------------------------------------------------
# The offline site


def test_drop_repo_links():
    "docs_postprocess drops the source links, the repository icon and the issue action; unwraps the rest."
    pp = tool('docs_postprocess')
    git = own_prefixes()[0]
    page = (
        f'<p><a href="{git}/blob/main/posenc_lit/tupe.py#L5" target="_blank" style="x">source</a></p>\n'
        f'<li class="nav-item compact"><a class="nav-link" href="{git}" aria-label="GitHub"><i></i></a></li>'
        f'<div class="action-links"><a href="{git}/issues/new" class="toc-action">Report</a></div>'
        f'<a href="{git}/blob/main/x.md"><code>x.md</code></a> <a href="https://arxiv.org/abs/1">paper</a>'
    )
    assert pp.drop_repo_links(page, git) == '<code>x.md</code> <a href="https://arxiv.org/abs/1">paper</a>'


def test_number_figures():
    "docs_postprocess numbers the captions of `fig-` cells in page order, as Quarto does; other cells not."
    pp = tool('docs_postprocess')
    page = (
        '<div id="fig-a" class="cell"><div class="cell-output">'
        '<figure><figcaption>A</figcaption></figure></div></div>'
        '<div class="cell" id="cell-3"><figcaption>plain</figcaption></div>'
        '<div class="cell" id="fig-b"><figcaption>B</figcaption><figcaption>C</figcaption></div>'
    )
    text, n = pp.number_figures(page)
    assert n == 2
    assert re.findall(r'<figcaption>([^<]*)</figcaption>', text) == [
        'Figure 1: A',
        'plain',
        'Figure 2 a: B',
        'Figure 2 b: C',
    ]


def page_ids(page, cache={}):
    if page not in cache:
        cache[page] = set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding='utf-8')))
    return cache[page]


def test_site_links_resolve(site):
    "No page links into the repository or the unpublished site; every local link and anchor resolves."
    git, host = own_prefixes()
    bad, n = [], 0
    for page in sorted(site.rglob('*.html')):
        text = re.sub(r'data:[^"\']*', '', page.read_text(encoding='utf-8'))
        for ref in map(html.unescape, HREF.findall(text)):
            u = urlsplit(ref)
            where = page.relative_to(site).as_posix()
            if ref.startswith((git, host)):
                bad.append(f'{where}: {ref}: into the project\'s repository or site, which are not published')
                continue
            if u.scheme or u.netloc or ref.startswith(('mailto:', 'javascript:')):
                continue
            n += 1
            target = (page.parent / unquote(u.path)).resolve() if u.path else page
            if not target.exists():
                bad.append(f'{where}: {ref}: no such file')
            elif u.fragment and target.suffix == '.html' and unquote(u.fragment) not in page_ids(target):
                bad.append(f'{where}: {ref}: no element with id {u.fragment!r}')
    assert n > 1000, f'only {n} local links checked'
    assert not bad, f'{len(bad)} links that do not resolve:\n  ' + '\n  '.join(bad[:40])


def test_site_figures_numbered(site):
    "Every figure cell (`#| label: fig-...`) of the site has a caption that starts with its number."
    seen, bad = 0, []
    for page in sorted(site.rglob('*.html')):
        text = page.read_text(encoding='utf-8')
        for m in re.finditer(r'<div\b[^>]*\bid="(fig-[^"]+)"', text):
            cap = re.search(r'<figcaption>(.*?)</figcaption>', text[m.end() :], re.S)
            seen += 1
            if not cap or not re.match(r'Figure \d+( [a-z])?: \S', cap.group(1)):
                bad.append(f'{page.name}#{m.group(1)}: {cap.group(1)[:60] if cap else "no caption"}')
    assert seen >= 10, f'only {seen} figure cells found in the site'
    assert not bad, 'figures without a numbered caption:\n  ' + '\n  '.join(bad)


def test_version_on_every_page(site):
    "Every page's footer names settings.ini's version and the commit the site was built from."
    ver = settings()['version']
    head = subprocess.run(
        ['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True
    )
    if head.returncode:
        pytest.skip('not a git checkout')
    missing = []
    for page in sorted(site.rglob('*.html')):
        m = re.search(
            r'<footer class="posenc-version"[^>]*>(.*?)</footer>', page.read_text(encoding='utf-8'), re.S
        )
        text = re.sub(r'<[^>]+>', '', m.group(1)) if m else ''
        sha = re.search(r'commit ([0-9a-f]{7,40})(-dirty)?', text)
        if f'posenc_lit {ver}' not in text or not sha:
            missing.append(page.relative_to(site).as_posix())
        elif not head.stdout.strip().startswith(sha.group(1)[:7]) and not sha.group(1).startswith(
            head.stdout.strip()
        ):
            pytest.skip(
                f'the site was built from commit {sha.group(1)}, the checkout is at {head.stdout.strip()}'
            )
    assert not missing, f'pages without version and commit in their footer: {missing}'


def test_docs_footer_replaces_its_line(tmp_path):
    "tools/docs_footer.py writes one footer line per page, also when run twice."
    df = tool('docs_footer')
    (tmp_path / 'sub').mkdir()
    for p in (tmp_path / 'index.html', tmp_path / 'sub' / 'a.html'):
        p.write_text('<html><body><p>x</p></body></html>', encoding='utf-8')
    assert df.stamp(tmp_path) == 2
    assert df.stamp(tmp_path) == 2
    a = (tmp_path / 'sub' / 'a.html').read_text(encoding='utf-8')
    assert a.count('class="posenc-version"') == 1 and f'posenc_lit {settings()["version"]}' in a
    assert 'href="../index.html#citing"' in a


# ----------------------------------------------------------------------------------------------------
# CITATION.cff


def test_citation_cff():
    "CITATION.cff is Citation File Format 1.2.0 with settings.ini's version and licence."
    cff = yaml.safe_load((ROOT / 'CITATION.cff').read_text(encoding='utf-8'))
    s = settings()
    assert cff.get('cff-version') == '1.2.0'
    for key in ('message', 'title', 'version'):
        assert (
            isinstance(cff.get(key), str) and cff[key].strip()
        ), f'CITATION.cff: {key} must be a non-empty string'
    assert (
        cff['version'] == s['version']
    ), f"CITATION.cff version {cff['version']} != settings.ini {s['version']}"
    assert (
        cff.get('license') == SPDX[s['license']]
    ), f"CITATION.cff license {cff.get('license')} != {s['license']}"
    authors = cff.get('authors')
    assert isinstance(authors, list) and authors, 'CITATION.cff: authors must be a non-empty list'
    assert all(isinstance(a, dict) and (a.get('name') or a.get('family-names')) for a in authors), authors


def test_readme_says_how_to_cite():
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    assert re.search(r'^## Citing$', readme, re.M) and 'CITATION.cff' in readme
