"The offline docs site: `tools/build_docs.sh` builds `_site/` with a page per notebook, titles, local KaTeX and maths."
import ast, html, json, re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from conftest import NBS, ROOT, SITE, exported, notebooks, page_of, quarto_pages

KATEX_CDN = re.compile(r'(?:https?:)?//[^"\'\s]*katex', re.I)
DATA_URI = re.compile(r'data:[^"\'\s)]*')   # embedded figures: base64 text, where `//...katex` can occur by chance
_re_title = re.compile(r'^#\s+(.+?)\s*$', re.M)
_re_display = re.compile(r'\$\$(.+?)\$\$', re.S)


def md_cells(nb):
    cells = json.loads(nb.read_text(encoding='utf-8'))['cells']
    return [''.join(c['source']) for c in cells if c['cell_type'] == 'markdown']


def title_of(nb):
    "The `# Title` of the notebook's first markdown cell, as plain text."
    for src in md_cells(nb):
        m = _re_title.search(src)
        if m: return re.sub(r'[`*]', '', m.group(1)).strip()


def text_of(page):
    "The page's visible text, tags removed and entities decoded, whitespace collapsed."
    s = page.read_text(encoding='utf-8')
    s = re.sub(r'<(script|style)\b.*?</\1>', ' ', s, flags=re.S | re.I)
    return re.sub(r'\s+', ' ', html.unescape(re.sub(r'<[^>]+>', ' ', s)))


def local_refs(page):
    "The local href/src targets of a page, resolved to paths under _site/."
    s = page.read_text(encoding='utf-8')
    for ref in re.findall(r'(?:href|src)="([^"]+)"', s):
        u = urlsplit(html.unescape(ref))
        if u.scheme or u.netloc or not u.path: continue
        yield ref, (page.parent / unquote(u.path)).resolve()


def test_page_per_notebook(site):
    nbs = notebooks()
    assert nbs, 'no notebooks in nbs/'
    missing = [str(nb.relative_to(NBS)) for nb in nbs if not page_of(nb).exists()]
    assert not missing, f'no page in _site/ for {missing}'


def test_pages_have_titles(site):
    for nb in notebooks():
        t = title_of(nb)
        assert t, f'{nb.name}: no "# Title" markdown heading'
        page = page_of(nb).read_text(encoding='utf-8')
        head = re.search(r'<title>(.*?)</title>', page, re.S)
        assert head and t in re.sub(r'[`*]', '', html.unescape(head.group(1))), f'{page_of(nb).name}: <title> lacks {t!r}'
        assert t in text_of(page_of(nb)), f'{page_of(nb).name}: page text lacks its title {t!r}'


def test_no_katex_cdn(site):
    bad = [p.name for p in site.rglob('*.html') if KATEX_CDN.search(DATA_URI.sub('', p.read_text(encoding='utf-8')))]
    assert not bad, f'pages load KaTeX from a remote URL: {bad}'


def test_local_katex_files_exist(site):
    "Pages with maths load KaTeX's CSS, script and auto-render from _site/, and every KaTeX file a page names exists."
    maths = [p for p in site.rglob('*.html') if 'class="math ' in p.read_text(encoding='utf-8')]
    if not maths: pytest.skip('no page has maths yet')
    for page in site.rglob('*.html'):
        refs = [(r, p) for r, p in local_refs(page) if 'katex' in r]
        for ref, p in refs: assert p.is_file(), f'{page.name}: {ref} does not exist'
        if page in maths:
            names = {p.name for _, p in refs}
            assert {'katex.min.css', 'katex.min.js', 'auto-render.min.js'} <= names, f'{page.name}: KaTeX refs {names}'
    css = (site / 'site_libs' / 'katex' / 'katex.min.css')
    fonts = set(re.findall(r'url\((fonts/[^)]+\.woff2)\)', css.read_text(encoding='utf-8')))
    assert fonts, 'katex.min.css names no woff2 fonts'
    missing = [f for f in fonts if not (css.parent / f).is_file()]
    assert not missing, f'KaTeX fonts missing: {missing}'


def test_display_maths_markup(site):
    "Display maths `$$...$$` reaches the page as `\\[...\\]` in span.math.display, which KaTeX's auto-render renders."
    found = 0
    for nb in notebooks():
        for src in md_cells(nb):
            for tex in _re_display.findall(src):
                page = page_of(nb).read_text(encoding='utf-8')
                want = re.sub(r'\s+', ' ', html.escape(tex.strip(), quote=False))
                spans = [re.sub(r'\s+', ' ', s) for s in re.findall(r'<span class="math display">(.*?)</span>', page, re.S)]
                assert any(s.replace('&quot;', '"').replace('&#x27;', "'") == f'\\[{want}\\]' for s in spans), \
                    f'{page_of(nb).name}: display maths {tex.strip()[:60]!r} not found as \\[...\\] in span.math.display'
                found += 1
                break  # one equation per cell is enough
    if not found: pytest.skip('no notebook has display maths yet')
    js = (site / 'site_libs' / 'smalldocs.js').read_text(encoding='utf-8')
    assert 'renderMathInElement' in js and r'left: "\\["' in js, 'smalldocs.js no longer calls auto-render with \\[ \\]'


def sidebar_notebooks() -> list[str]:
    "The notebooks of nbs/sidebar.yml in the order it lists them."
    import yaml
    out = []
    def walk(items):
        for it in items or []:
            if isinstance(it, str): out.append(it)
            elif isinstance(it, dict): walk(it.get('contents'))
    walk(yaml.safe_load((NBS / 'sidebar.yml').read_text(encoding='utf-8'))['website']['sidebar']['contents'])
    return out


def test_notebooks_numbered_in_reading_order():
    "The notebooks' numbers follow the sidebar (the reader's order), and every notebook is listed once (issue 39)."
    listed = [n for n in sidebar_notebooks() if n != 'index.ipynb']
    numbers = [int(re.match(r'(\d+)_', n).group(1)) for n in listed]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), f'numbers out of order: {listed}'
    have = sorted(nb.relative_to(NBS).as_posix() for nb in notebooks() if nb.name != 'index.ipynb')
    assert sorted(listed) == have, f'sidebar and nbs/ differ: {set(listed) ^ set(have)}'


def test_sidebar_links_resolve(site):
    "Every local link of the home page (navbar and sidebar) points at a page that exists, and every notebook is in the sidebar."
    index = site / 'index.html'
    assert index.exists(), 'no index.html: nbs/index.ipynb is the home page'
    s = index.read_text(encoding='utf-8')
    bar = s[s.find('id="quarto-sidebar"'):]
    bar = bar[:bar.find('</nav>')]
    broken = [ref for ref, p in local_refs(index) if ref.endswith('.html') and not p.exists()]
    assert not broken, f'links to missing pages (a notebook in nbs/sidebar.yml does not exist yet?): {broken}'
    linked = set(re.findall(r'href="([^"#]+\.html)"', bar))
    absent = [str(nb.relative_to(NBS)) for nb in notebooks() if page_of(nb).relative_to(site).as_posix() not in linked]
    assert not absent, f'notebooks missing from nbs/sidebar.yml: {absent}'


def test_api_entries(site):
    "Every exported function and class has its API entry (nbdev's show_doc): an anchored heading on its module's page."
    idx = {}
    exec((ROOT / 'posenc_lit' / '_modidx.py').read_text(encoding='utf-8'), idx)
    pages, ids, missing, n = quarto_pages(), {}, [], 0
    for module, syms in idx['d']['syms'].items():
        for name in exported(module):
            entry = syms.get(f'{module}.{name}')
            if entry is None: continue     # a constant: nbdev documents functions and classes
            page, anchor = entry[0].split('#')
            assert page in pages, f'{module}.{name}: its page {page} is not in the site ({sorted(pages)})'
            if page not in ids: ids[page] = set(re.findall(r'<h[2-4] id="([^"]+)"', (site / pages[page]).read_text(encoding='utf-8')))
            n += 1
            if anchor not in ids[page]: missing.append(f'{module}.{name} ({pages[page]}#{anchor})')
    assert n > 100, f'only {n} exported functions and classes found in posenc_lit/_modidx.py'
    assert not missing, f'exported symbols without an API entry: {missing}'


# ----------------------------------------------------------------------------------------------------
# Figures: a number, a caption and alt text, at a size that reads (issue 28)

# Notebooks whose figures do not yet all have a label, caption and alt text at a readable size. Each is an
# expected failure (strict): when a notebook is fixed its test passes, which fails here -- then take it off
# the list.
FIG_PENDING = set()
MIN_FIG_PX = (400, 150)   # width, height of a committed PNG output


def png_size(b64):
    "(width, height) of a base64 PNG, read from its IHDR chunk."
    import base64, struct
    head = base64.b64decode(b64[:64])
    assert head[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
    return struct.unpack('>II', head[16:24])


def figure_problems(nb):
    "What each figure cell of notebook `nb` lacks: `label: fig-...`, `fig-cap`, `fig-alt`, a readable size."
    problems = []
    for i, c in enumerate(json.loads(nb.read_text(encoding='utf-8'))['cells']):
        outs = [o.get('data', {}) for o in c.get('outputs', [])]
        pngs = [''.join(d['image/png']) for d in outs if 'image/png' in d]
        if c['cell_type'] != 'code' or not pngs: continue
        opts = dict(re.findall(r'^#\|\s*([\w-]+)\s*:\s*(.*?)\s*$', ''.join(c['source']), re.M))
        where = f"{nb.name} cell {i} ({c.get('id')})"
        if not opts.get('label', '').startswith('fig-'):
            problems.append(f'{where}: no `#| label: fig-...` (the figure number)')
        for key in ('fig-cap', 'fig-alt'):
            if not opts.get(key, '').strip('"\' '): problems.append(f'{where}: no `#| {key}:`')
        for w, h in map(png_size, pngs):
            if w < MIN_FIG_PX[0] or h < MIN_FIG_PX[1]:
                problems.append(f'{where}: a {w}×{h} px figure (at least {MIN_FIG_PX[0]}×{MIN_FIG_PX[1]})')
    return problems


def test_png_size():
    import base64, struct, zlib
    ihdr = struct.pack('>IIBBBBB', 640, 200, 8, 2, 0, 0, 0)
    raw = b'\x89PNG\r\n\x1a\n' + struct.pack('>I', 13) + b'IHDR' + ihdr
    assert png_size(base64.b64encode(raw + struct.pack('>I', zlib.crc32(raw[12:]))).decode()) == (640, 200)


@pytest.mark.parametrize('nb', notebooks(), ids=lambda nb: nb.stem)
def test_figures_have_number_caption_alt(nb, request):
    "Every figure of a notebook has a label (`fig-...`, its number), a caption, alt text, a readable size."
    if nb.stem in FIG_PENDING:
        why = f'{nb.stem} is in FIG_PENDING; fixed? remove it there'
        request.applymarker(pytest.mark.xfail(strict=True, reason=why))
    problems = figure_problems(nb)
    assert not problems, '\n'.join(problems)


def test_readme_sample_is_the_committed_quick_run():
    """The main job's output in nbs/index.ipynb (and README.md) is `format_results` of the committed quick run, with
    the committed probe study as its probe table (what `compare --preset quick` reads and prints)."""
    from posenc_lit.report import format_results
    from posenc_lit.probes import read_probe_results
    res = json.loads((ROOT / 'results' / 'compare' / 'quick' / 'results.json').read_text(encoding='utf-8'))
    if not res.get('finished'): pytest.skip('results/compare/quick/results.json is a run in progress')
    res['probes'] = read_probe_results(ROOT / 'results' / 'probes' / 'study' / 'probes.json')
    cells = json.loads((NBS / 'index.ipynb').read_text(encoding='utf-8'))['cells']
    cell = next(c for c in cells if "print(format_results({**quick, 'probes': probe_study}))" in ''.join(c['source']))
    printed = ''.join(''.join(o['text']) for o in cell.get('outputs', []) if o.get('name') == 'stdout')
    assert printed.rstrip('\n') == format_results(res).rstrip('\n'), \
        ('nbs/index.ipynb shows another run than results/compare/quick/results.json: re-execute it '
         '(cd nbs && jupyter nbconvert --to notebook --execute --inplace index.ipynb), '
         'then python tools/make_readme.py')


# Signatures in the docs (issue 28): nbdev shows a parameter that defaults to None without a type as
# `name:NoneType=None`, and turns a backticked exported name in a parameter's comment into a Markdown link that
# the signature's code block then shows raw. Notebooks not fixed yet would be strict expected failures listed
# here (take a notebook off the list when its test passes); none is left.
SIGNATURE_PENDING = set()


def documented_defs(nb):
    "(source lines, node) for each public def of the exported cells of `nb`: module level, methods, dataclasses."
    for c in json.loads(nb.read_text(encoding='utf-8'))['cells']:
        src = ''.join(c['source'])
        if c['cell_type'] != 'code' or not re.search(r'^#\|\s*export', src, re.M): continue
        lines = src.splitlines()
        tree = ast.parse('\n'.join('' if l.lstrip().startswith('#|') else l for l in lines))
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith('_'): continue
            yield lines, node
            if isinstance(node, ast.ClassDef):
                yield from ((lines, m) for m in node.body if isinstance(m, ast.FunctionDef)
                            and (not m.name.startswith('_') or m.name == '__init__'))


def signature_problems(nb, names):
    "Untyped `=None` parameters and backticked names of `names` in the signature comments of notebook `nb`."
    problems = []
    for lines, node in documented_defs(nb):
        if isinstance(node, ast.ClassDef):   # dataclass fields and their comments
            rows = [k for st in node.body if isinstance(st, ast.AnnAssign) for k in range(st.lineno - 2, st.end_lineno)]
        else:
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            problems += [f'{nb.name}: {node.name}({x.arg}=None) has no type (the docs show `NoneType=None`)'
                         for x, d in pairs if isinstance(d, ast.Constant) and d.value is None and x.annotation is None]
            rows = range(node.lineno - 1, node.body[0].lineno - 1)
        for k in rows:
            comment = lines[k].partition('#')[2] if k >= 0 else ''
            for n in re.findall(r'`([^`]+)`', comment):
                if n.strip().removesuffix('()') in names:
                    problems.append(f'{nb.name}: `{n}` in a signature comment of {node.name} (nbdev makes it a '
                                    'raw Markdown link there): name it in the docstring')
    return problems


def test_signature_problems():
    src = '''#| export
def f(x, mask=None, ok: int | None = None):  # see `g`
    "doc"
def _private(y=None): pass
class C:
    def m(self, layer=None,  # from `g`, `(b, n)`
          ): pass
'''
    nb = ROOT / 'tests' / '_signature_probe.ipynb'
    nb.write_text(json.dumps({'cells': [{'cell_type': 'code', 'source': src.splitlines(True)}]}), encoding='utf-8')
    try:
        found = signature_problems(nb, {'g'})
    finally:
        nb.unlink()
    assert len(found) == 4, found   # f(mask), `g` on f's line, C.m(layer), `g` in m's comment; not _private or ok
    assert sum('NoneType' in p for p in found) == 2


@pytest.mark.parametrize('nb', notebooks(), ids=lambda nb: nb.stem)
def test_signatures_typed_without_links(nb, request):
    "No exported signature shows `NoneType=None` or a raw Markdown link in a parameter's comment."
    if nb.stem in SIGNATURE_PENDING:
        why = f'{nb.stem} is in SIGNATURE_PENDING; fixed? remove it there'
        request.applymarker(pytest.mark.xfail(strict=True, reason=why))
    # what nbdev links: the symbols of posenc_lit/_modidx.py (`name`, `Class.method`, `posenc_lit.mod.name`)
    tree = ast.parse((ROOT / 'posenc_lit' / '_modidx.py').read_text(encoding='utf-8'))
    syms = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)))['syms']
    names = {s for mod in syms.values() for full in mod for s in (full, full.split('.', 2)[2])}
    problems = signature_problems(nb, names)
    assert not problems, '\n'.join(problems)
