"""The offline docs site as a reader meets it: every page of `_site/` served on 127.0.0.1 and loaded in headless
Chromium, driven through the Chrome DevTools Protocol (CDP).

Asserts, for every page: no console errors or uncaught exceptions, no failed or outside requests, no broken link
(local pages, files and `#anchors`, checked over the whole site) or image, maths rendered by KaTeX with no raw TeX
left in the text; the sidebar lists every notebook in the order of `nbs/sidebar.yml`, its groups in the reader's
order; every exported function and class has its API entry; from the front page, each encoding's derivation, API
entry and experiment results are one or two clicks away. Screenshots of the front page and of an encoding page are
saved in `tests/artifacts/` (POSENC_LIT_ARTIFACTS to change).

Needs `chromium` (Debian: `apt-get install chromium`). Without it the tests skip, unless POSENC_LIT_REQUIRE_BROWSER=1
(set by .ci/run, which installs it), where they fail.
"""
import base64, functools, http.server, json, os, re, shutil, subprocess, tempfile, threading, time
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest
import yaml

from conftest import NBS, ROOT, exported, notebooks, quarto_pages

ARTIFACTS = Path(os.environ.get('POSENC_LIT_ARTIFACTS', ROOT / 'tests' / 'artifacts'))
BROWSERS = ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable')
# the reader's order of the sidebar's groups (STYLE.md); groups not named here may stand anywhere
GROUPS = ['Core', 'Absolute', 'Relative', 'Untied & disentangled', 'Beyond the papers', 'Vision',
          'Models and training', 'Fine-tuning', 'Experiments', 'Benchmarks', 'Utilities']
RAW_TEX = re.compile(r'\$\$|\\[()\[\]]|\\(?:begin|frac|mathrm|sqrt|text|operatorname)\{|\$[^$\n]{0,200}?[\\^_{][^$\n]{0,200}?\$')


def browser_path():
    return next(filter(None, map(shutil.which, BROWSERS)), None)


@pytest.fixture(scope='session')
def chromium_bin():
    path = browser_path()
    if path: return path
    msg = f'no Chromium on PATH (looked for {", ".join(BROWSERS)}): apt-get install chromium'
    if os.environ.get('POSENC_LIT_REQUIRE_BROWSER') == '1': pytest.fail(msg + ' (POSENC_LIT_REQUIRE_BROWSER=1)', pytrace=False)
    pytest.skip(msg)


# ---------------------------------------------------------------------------------------------------------------
# A static server for the site, on loopback

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass


@pytest.fixture(scope='session')
def server(site):
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(_Quiet, directory=str(site)))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f'http://127.0.0.1:{httpd.server_address[1]}'
    httpd.shutdown(); httpd.server_close()


# ---------------------------------------------------------------------------------------------------------------
# A small CDP client over the browser's websocket (websocket-client), with flat sessions per tab

class CDP:
    def __init__(self, ws_url):
        import websocket
        self._ws_mod = websocket
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.n, self.events = 0, []

    def _recv(self, deadline):
        self.ws.settimeout(max(0.01, deadline - time.monotonic()))
        m = json.loads(self.ws.recv())
        if 'method' in m: self.events.append(m)
        return m

    def call(self, method, session=None, timeout=60, **params):
        self.n += 1
        msg = {'id': self.n, 'method': method, 'params': params, **({'sessionId': session} if session else {})}
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            m = self._recv(deadline)
            if m.get('id') == self.n:
                if 'error' in m: raise RuntimeError(f'CDP {method}: {m["error"]}')
                return m.get('result', {})

    def wait_for(self, method, session, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e['method'] == method and e.get('sessionId') == session: return e
            try: self._recv(deadline)
            except self._ws_mod.WebSocketTimeoutException:
                raise TimeoutError(f'no {method} within {timeout} s') from None

    def evaluate(self, session, expression, timeout=60):
        r = self.call('Runtime.evaluate', session, timeout=timeout, expression=expression, returnByValue=True, awaitPromise=True)
        if 'exceptionDetails' in r: raise RuntimeError(f'page script failed: {r["exceptionDetails"]}')
        return r['result'].get('value')

    def close(self): self.ws.close()


def _launch(path, profile):
    # Offline and quiet: no first-run, sync, update or other background traffic, and host names other than the
    # loopback address do not resolve (the site must not need the network).
    args = [path, '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
            '--no-default-browser-check', '--disable-background-networking', '--disable-component-update',
            '--disable-sync', '--disable-default-apps', '--disable-extensions', '--disable-domain-reliability',
            '--disable-client-side-phishing-detection', '--disable-features=Translate,OptimizationHints,MediaRouter',
            '--metrics-recording-only', '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1', '--hide-scrollbars',
            f'--user-data-dir={profile}', '--remote-debugging-port=0', '--window-size=1280,1000', 'about:blank']
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port_file, deadline = Path(profile) / 'DevToolsActivePort', time.monotonic() + 60
    while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
        if proc.poll() is not None: raise RuntimeError(f'chromium exited ({proc.returncode}): {proc.stderr.read()[-2000:]}')
        if time.monotonic() > deadline: proc.kill(); raise RuntimeError('chromium did not open its DevTools port in 60 s')
        time.sleep(0.1)
    port, ws_path = port_file.read_text().split()[:2]
    return proc, f'ws://127.0.0.1:{port}{ws_path}'


@pytest.fixture(scope='session')
def browser(chromium_bin):
    profile = tempfile.mkdtemp(prefix='posenc_lit_chromium.')
    proc, ws_url = _launch(chromium_bin, profile)
    cdp = CDP(ws_url)
    try:
        tid = cdp.call('Target.createTarget', url='about:blank')['targetId']
        sid = cdp.call('Target.attachToTarget', targetId=tid, flatten=True)['sessionId']
        for domain in ('Page', 'Runtime', 'Log', 'Network'): cdp.call(f'{domain}.enable', sid)
        cdp.call('Emulation.setDeviceMetricsOverride', sid, width=1280, height=1000, deviceScaleFactor=1, mobile=False)
        yield cdp, sid
    finally:
        cdp.close()
        proc.terminate()
        try: proc.wait(10)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# Visit every page once; the tests below read what each visit found

COLLECT = r'''(async () => {
  await document.fonts.ready;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const q = (s, root = document) => [...root.querySelectorAll(s)];
  const main = document.querySelector('main') || document.body;
  const clone = main.cloneNode(true);
  q('pre, code, script, style, .katex, .sourceCode, textarea', clone).forEach(e => e.remove());
  const bar = document.querySelector('#quarto-sidebar');
  const box = bar ? bar.getBoundingClientRect() : null;
  return {
    title: document.title,
    links: q('a[href]').map(a => ({href: a.href, raw: a.getAttribute('href')})),
    images: q('img').map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0,
                                alt: (i.getAttribute('alt') || '').trim()})),
    ids: q('[id]').map(e => e.id).concat(q('a[name]').map(e => e.name)),
    math: q('span.math').length,
    mathRendered: q('span.math').filter(s => s.querySelector('.katex')).length,
    katex: q('.katex').length,
    katexErrors: q('.katex-error').map(e => e.textContent.slice(0, 100)),
    text: clone.textContent,
    sidebar: q('#quarto-sidebar a.sidebar-link[href]').map(a => a.getAttribute('href')),
    groups: q('#quarto-sidebar .sidebar-item-section > .sidebar-item-container .menu-text').map(e => e.textContent.trim()),
    sidebarBox: box ? [box.width, box.height] : null,
    firstFigure: (e => e ? e.getBoundingClientRect().bottom + window.scrollY : null)(main.querySelector('.cell-output-display img')),
    firstMaths: (e => e ? e.getBoundingClientRect().top + window.scrollY : null)(main.querySelector('.katex')),
    heads: q('h2[id], h3[id], h4[id]').map(h => {
      let n = h.nextElementSibling;
      return {id: h.id, text: h.textContent.trim(), next: n ? n.textContent.trim().slice(0, 300) : ''};
    }),
  };
})()'''


def _console_errors(events):
    out = []
    for e in events:
        m, p = e['method'], e.get('params', {})
        if m == 'Runtime.consoleAPICalled' and p.get('type') in ('error', 'assert'):
            out.append('console.' + p['type'] + ': ' + ' '.join(str(a.get('value', a.get('description', ''))) for a in p.get('args', [])))
        elif m == 'Runtime.exceptionThrown':
            d = p.get('exceptionDetails', {})
            out.append('uncaught: ' + (d.get('exception', {}).get('description') or d.get('text', '')))
        elif m == 'Log.entryAdded' and p.get('entry', {}).get('level') == 'error':
            out.append(f"log: {p['entry'].get('text')} ({p['entry'].get('url', '')})")
    return out


def _requests(events, origin):
    "Requests that failed (network error or HTTP status ≥ 400) and requests that left the loopback server."
    failed, outside = [], []
    for e in events:
        m, p = e['method'], e.get('params', {})
        if m == 'Network.requestWillBeSent':
            url = p['request']['url']
            if not (url.startswith(origin + '/') or url.split(':', 1)[0] in ('data', 'blob', 'about')): outside.append(url)
        elif m == 'Network.responseReceived' and p['response'].get('status', 0) >= 400:
            failed.append(f"{p['response']['status']} {p['response']['url']}")
        elif m == 'Network.loadingFailed' and not p.get('canceled'):
            failed.append(f"{p.get('errorText')} (request {p.get('requestId')}, {p.get('type')})")
    return failed, outside


def _screenshot(cdp, sid, url, path, bottom):
    "A PNG of the page at `url` from its top down to `bottom` px (below the first figure: navbar, sidebar, text, figure)."
    cdp.events.clear()  # a load event left from an earlier page would end the wait below at once
    cdp.call('Page.navigate', sid, url=url)
    cdp.wait_for('Page.loadEventFired', sid, timeout=60)
    cdp.evaluate(sid, 'document.fonts.ready.then(() => new Promise(r => setTimeout(r, 200)))')
    clip = {'x': 0, 'y': 0, 'width': 1280, 'height': int(min(bottom + 24, 4000)), 'scale': 1}
    png = cdp.call('Page.captureScreenshot', sid, format='png', clip=clip, captureBeyondViewport=True)['data']
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(png))
    return path


def encoding_pages():
    "The site's pages that derive a registered encoding (the pages of the modules that register them)."
    from posenc_lit.core import list_encodings
    syms, pages = _modidx()['syms'], quarto_pages()
    mods = {spec.factory.__module__ for spec in list_encodings().values()}
    return {pages[next(iter(syms[m].values()))[0].split('#')[0]] for m in mods if syms.get(m)}


def shot_page(visits):
    "The encoding page to photograph: rendered maths above its first figure, and that figure nearest the top."
    ok = [(f['firstFigure'], p) for p, f in visits.items() if p in encoding_pages() and f['firstFigure']
          and f['firstMaths'] is not None and f['firstMaths'] < f['firstFigure']]
    return min(ok)[1] if ok else None


@pytest.fixture(scope='session')
def visits(site, server, browser):
    "{page path under _site/: what loading it found}; the screenshots are taken on the way."
    cdp, sid = browser
    pages, out = sorted(p.relative_to(site).as_posix() for p in site.rglob('*.html')), {}
    assert pages, f'no pages in {site}'
    for page in pages:
        cdp.events.clear()
        cdp.call('Page.navigate', sid, url=f'{server}/{page}')
        cdp.wait_for('Page.loadEventFired', sid, timeout=60)
        found = cdp.evaluate(sid, COLLECT)
        cdp.evaluate(sid, '0')          # one more round trip: late events of this page arrive before the next
        found['console'] = _console_errors(cdp.events)
        found['failed'], found['outside'] = _requests(cdp.events, server)
        out[page] = found
    enc = shot_page(out)
    for page, name in (('index.html', 'front_page.png'), (enc, 'encoding_page.png')):
        if page and out[page]['firstFigure']:
            out[page]['shot'] = _screenshot(cdp, sid, f'{server}/{page}', ARTIFACTS / name, out[page]['firstFigure'])
    shots = [f"{f['shot']} ({p})" for p, f in out.items() if 'shot' in f]
    print(f'\nvisited {len(out)} pages in Chromium; screenshots: {", ".join(shots)}')
    return out


# ---------------------------------------------------------------------------------------------------------------
# The tests

def test_every_page_loads_cleanly(visits):
    "No console error, uncaught exception or failed request on any page, and nothing requested from outside."
    bad = {p: f['console'] + f['failed'] for p, f in visits.items() if f['console'] or f['failed']}
    assert not bad, 'pages with console errors or failed requests:\n' + json.dumps(bad, indent=1)[:4000]
    outside = {p: f['outside'] for p, f in visits.items() if f['outside']}
    assert not outside, f'pages that request outside the local site: {outside}'


def test_no_broken_links(visits, site, server):
    "Every local link of every page resolves: the file exists and an `#anchor` names an element of the target page."
    host = _doc_host()
    ids = {p: set(f['ids']) for p, f in visits.items()}
    broken, n = [], 0
    for page, f in visits.items():
        for link in f['links']:
            href, raw = link['href'], link['raw']
            if href.startswith('javascript:') or raw.startswith('#') and len(raw) == 1: continue
            if host and href.startswith(host):
                broken.append(f'{page}: {raw} points at the published site, not at the local page'); continue
            if not href.startswith(server + '/'): continue          # outside links (GitHub, papers): not reachable here
            url, frag = urldefrag(href)
            path = unquote(urlsplit(url).path).lstrip('/') or 'index.html'
            if path.endswith('/'): path += 'index.html'
            n += 1
            if not (site / path).is_file(): broken.append(f'{page}: {raw} -> no file {path}')
            elif frag and path in ids and unquote(frag) not in ids[path]: broken.append(f'{page}: {raw} -> no #{frag} in {path}')
    assert n > 100, f'only {n} local links found'
    assert not broken, f'{len(broken)} broken links:\n' + '\n'.join(broken[:60])


def test_images_load(visits):
    "Every image (figures, logos) loaded and has a size."
    bad = {p: [i['src'][:120] for i in f['images'] if not i['ok']] for p, f in visits.items()}
    bad = {p: v for p, v in bad.items() if v}
    assert not bad, f'images that did not load: {bad}'
    assert sum(len(f['images']) for f in visits.values()) > 10, 'almost no images on the site: are the figures missing?'


def test_images_have_alt_text(visits):
    "Every <img> on every page (figures, logos) has alt text a screen reader can read (issue 28)."
    bad = {p: [i['src'][:120] for i in f['images'] if not i['alt']] for p, f in visits.items()}
    bad = {p: v for p, v in bad.items() if v}
    assert not bad, f'images without alt text: {bad}'


def test_maths_rendered(visits):
    "Every maths span is rendered by KaTeX, without errors, and no raw TeX delimiter is left in the visible text."
    with_maths = [p for p, f in visits.items() if f['math']]
    assert len(with_maths) >= 5, f'only {with_maths} have maths'
    for page in with_maths:
        f = visits[page]
        assert f['mathRendered'] == f['math'], f"{page}: {f['math'] - f['mathRendered']} of {f['math']} maths spans not rendered"
        assert not f['katexErrors'], f"{page}: KaTeX errors {f['katexErrors'][:5]}"
    for page, f in visits.items():
        left = [f['text'][max(0, m.start() - 40):m.end() + 40] for m in RAW_TEX.finditer(f['text'])]
        assert not left, f'{page}: raw TeX in the text: {left[:5]}'


def _sidebar_yml():
    "(pages in order, group titles in order) of nbs/sidebar.yml."
    pages, groups = [], []
    def walk(items):
        for it in items or []:
            if isinstance(it, str): pages.append(it)
            elif isinstance(it, dict):
                if 'section' in it: groups.append(it['section'])
                if 'href' in it: pages.append(it['href'])
                walk(it.get('contents'))
    walk(yaml.safe_load((NBS / 'sidebar.yml').read_text(encoding='utf-8'))['website']['sidebar']['contents'])
    return [re.sub(r'\.ipynb$', '.html', p) for p in pages], groups


def test_sidebar(visits):
    "The sidebar is shown, lists the pages of nbs/sidebar.yml in order, every notebook among them, with the same groups in the reader's order, on every page."
    pages, groups = _sidebar_yml()
    f = visits['index.html']
    assert f['sidebarBox'] and f['sidebarBox'][0] > 100, f"the sidebar is not shown at 1280 px ({f['sidebarBox']})"
    assert f['sidebar'] == pages, f"sidebar links {f['sidebar']} differ from nbs/sidebar.yml {pages}"
    missing = [nb.relative_to(NBS).with_suffix('.html').as_posix() for nb in notebooks()]
    missing = [p for p in missing if p not in f['sidebar']]
    assert not missing, f'notebooks missing from the sidebar (add them to nbs/sidebar.yml): {missing}'
    assert f['groups'] == groups, f"sidebar groups {f['groups']} differ from nbs/sidebar.yml {groups}"
    known = [g for g in f['groups'] if g in GROUPS]
    assert known == sorted(known, key=GROUPS.index), f'sidebar groups {known} are not in the order {GROUPS}'
    assert {'Core', 'Absolute', 'Relative', 'Experiments'} <= set(known), f'missing sidebar groups: {known}'
    other = [p for p, v in visits.items() if v['sidebar'] != f['sidebar']]
    assert not other, f'pages whose sidebar differs from the front page\'s: {other}'


def _modidx():
    d = {}
    exec((ROOT / 'posenc_lit' / '_modidx.py').read_text(encoding='utf-8'), d)
    return d['d']


def _doc_host():
    s = _modidx()['settings']
    return (s.get('doc_host', '') + s.get('doc_baseurl', '')).rstrip('/')


def test_api_entries_rendered(visits):
    "Each exported function and class has a heading with its name, followed by its signature (nbdev's show_doc)."
    pages, bad, n = quarto_pages(), [], 0
    for module, syms in _modidx()['syms'].items():
        for name in exported(module):
            entry = syms.get(f'{module}.{name}')
            if entry is None: continue
            page, anchor = entry[0].split('#')
            heads = {h['id']: h for h in visits.get(pages.get(page, page), {}).get('heads', [])}
            h, n = heads.get(anchor), n + 1
            if h is None: bad.append(f'{module}.{name}: no heading #{anchor} on {pages.get(page)}'); continue
            if name not in h['text']: bad.append(f"{module}.{name}: heading reads {h['text']!r}")
            elif not re.search(rf'\b(def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*\(', h['next'], re.M):
                bad.append(f"{module}.{name}: no signature after its heading ({h['next'][:80]!r})")
    assert n > 100 and not bad, f'{len(bad)} of {n} API entries wrong:\n' + '\n'.join(bad[:40])


def test_two_clicks_from_front_page(visits):
    "From the front page, every encoding's page (its derivation), its API entry and the experiment results are at most two clicks away."
    from posenc_lit.core import list_encodings
    from posenc_lit.catalog import encoding_facts
    host, pages = _doc_host(), quarto_pages()
    def local(url):  # a published URL -> (local page, anchor)
        path, _, frag = url[len(host) + 1:].partition('#')
        return pages.get(path, path), frag
    def targets(page):
        out = set()
        for l in visits.get(page, {}).get('links', []):
            u, frag = urldefrag(l['href'])
            p = unquote(urlsplit(u).path).lstrip('/') if u.startswith('http://127.0.0.1') else None
            if p is not None: out.add((p or 'index.html', frag))
        return out
    one = targets('index.html')
    two = one | {t for p, _ in one for t in targets(p)}
    reached = lambda t: t in two or (t[1] == '' and any(p == t[0] for p, _ in two))
    need = {'pretraining results': (pages['pretraining.html'], '')}
    for name in list_encodings():
        f = encoding_facts(name)
        need[f'{name}: derivation'], need[f'{name}: API entry'] = local(f['page']), local(f['api'])
    far = {k: v for k, v in need.items() if not reached(v)}
    assert not far, f'more than two clicks from the front page: {far}'


def test_screenshots(visits):
    "Screenshots of the front page and of an encoding page: from the top (navbar, sidebar) to a figure, the encoding page with rendered maths above it."
    enc = shot_page(visits)
    assert enc, 'no encoding page has rendered maths above a figure'
    for page in ('index.html', enc):
        f = visits[page]
        assert 'shot' in f, f'{page}: no screenshot (no figure on the page?)'
        png = f['shot'].read_bytes()
        assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 20_000, f"{f['shot']}: not a real screenshot"
        assert f['sidebar'] and f['sidebarBox'][0] > 100, f'{page}: no sidebar in the screenshot'


# ---------------------------------------------------------------------------------------------------------------
# Reading surface (issue 28): the implementation beside its equation, code that fits the column, readable search
# results, equation numbers a phone can reach. These pages are read at 1400 px (and 390 px for the phone).

READ_PAGES = ('05_relative.html', '07_tupe.html', '08_deberta.html')   # the relative, TUPE and DeBERTa pages

CODE_BLOCKS = r'''(async () => {
  await document.fonts.ready;
  const main = document.querySelector('main');
  const visible = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0 && e.offsetParent !== null
                         && getComputedStyle(e).visibility !== 'hidden'; };
  const blocks = [...main.querySelectorAll('pre')].map(p => {
    const keep = p.style.whiteSpace, code = p.querySelector('code');
    const keepCode = code ? code.style.whiteSpace : null;
    const wrapped = p.scrollWidth > p.clientWidth + 1;
    // the same block unwrapped: does its longest line fit the column as it is?
    p.style.whiteSpace = 'pre'; if (code) code.style.whiteSpace = 'pre';
    const unwrapped = p.scrollWidth > p.clientWidth + 1;
    p.style.whiteSpace = keep; if (code) code.style.whiteSpace = keepCode;
    return {text: p.textContent, visible: visible(p), overflows: wrapped, overflowsUnwrapped: unwrapped,
            sw: p.scrollWidth, cw: p.clientWidth};
  });
  return {width: innerWidth, column: main.clientWidth, blocks};
})()'''

# WCAG 2 contrast of an element's text against what is painted behind it (alpha composited over the ancestors)
CONTRAST = r'''
function rgba(s) { const m = s.match(/[\d.]+/g) || [0, 0, 0, 0]; return m.map(Number).concat([1]).slice(0, 4); }
function over(top, under) { const a = top[3]; return [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a)).concat([1]); }
function background(e) {
  const layers = [];
  for (; e; e = e.parentElement) { const c = rgba(getComputedStyle(e).backgroundColor); if (c[3] > 0) layers.push(c); if (c[3] >= 1) break; }
  return layers.reverse().reduce((under, top) => over(top, under), [255, 255, 255, 1]);
}
function lum(c) { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
                  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); }
function contrast(e) {
  const bg = background(e), fg = over(rgba(getComputedStyle(e).color), bg);
  const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
  return (a + 0.05) / (b + 0.05);
}'''

SEARCH = CONTRAST + r'''
(async () => {
  let input = null;   // the search box is built by a script after load: wait for it (up to 20 s on a busy machine)
  for (let t = 0; t < 200 && !(input = document.querySelector('.smalldocs-search input, #quarto-search input')); t++)
    await new Promise(r => setTimeout(r, 100));
  if (!input) return {error: 'no search box after 20 s'};
  // the index (search.json) loads on first use: type again every second until results show (up to 40 s)
  input.focus();
  for (let t = 0; t < 400 && !document.querySelector('.search-result'); t++) {
    if (t % 10 === 0) { input.value = 'relative'; input.dispatchEvent(new Event('input', {bubbles: true})); }
    await new Promise(r => setTimeout(r, 100));
  }
  const parts = [...document.querySelectorAll('.search-result-title, .search-result-section, .search-result-text, .search-result mark')];
  const out = parts.filter(e => e.textContent.trim()).map(e => ({part: e.className || e.tagName.toLowerCase(),
                                                                 text: e.textContent.trim().slice(0, 40), ratio: contrast(e)}));
  input.value = ''; input.dispatchEvent(new Event('input', {bubbles: true})); input.blur();
  return {results: document.querySelectorAll('.search-result').length, parts: out};
})()'''

PHONE = r'''(async () => {
  await document.fonts.ready;
  const out = [];
  for (const m of document.querySelectorAll('main span.math.display')) {
    // the text of an equation number, "(eq. 4)" or "(4)", is inside the rendered maths
    const nums = [...m.querySelectorAll('.katex-html *')].filter(e => !e.children.length && /^\((?:eq\.\s*)?[\d.–\-]+\)$/.test(e.textContent.trim())
                                                                    || e.classList.contains('tag'));
    if (!nums.length) continue;
    const num = nums[nums.length - 1].getBoundingClientRect();
    // the nearest box that scrolls sideways, if any; and any ancestor that cuts content off without scrolling
    let scroller = null, clipped = null;
    for (let e = nums[nums.length - 1].parentElement; e && e !== document.body; e = e.parentElement) {
      const ox = getComputedStyle(e).overflowX, r = e.getBoundingClientRect();
      if (!scroller && /auto|scroll/.test(ox)) scroller = e;
      if (!scroller && /hidden|clip/.test(ox) && num.right > r.right + 1) clipped = e.tagName.toLowerCase() + '.' + e.className;
    }
    const reach = scroller ? scroller.getBoundingClientRect().left - scroller.scrollLeft + scroller.scrollWidth : innerWidth;
    out.push({text: nums[nums.length - 1].textContent.trim(), right: num.right, reach, clipped,
              inWindow: num.right <= innerWidth + 1 || !!scroller});
  }
  return {width: innerWidth, pageWidth: document.documentElement.scrollWidth, numbers: out};
})()'''


def _visit(cdp, sid, url, script, width):
    cdp.call('Emulation.setDeviceMetricsOverride', sid, width=width, height=1000, deviceScaleFactor=1, mobile=width < 600)
    try:
        # no load event left from an earlier page (a screenshot's): the script ran on a page still loading once
        cdp.events.clear()
        cdp.call('Page.navigate', sid, url=url)
        cdp.wait_for('Page.loadEventFired', sid, timeout=60)
        cdp.events.clear()
        return cdp.evaluate(sid, script, timeout=90)
    finally:
        cdp.call('Emulation.setDeviceMetricsOverride', sid, width=1280, height=1000, deviceScaleFactor=1, mobile=False)


@pytest.fixture(scope='session')
def code_blocks(site, server, browser):
    "{page: its code blocks at 1400 px} for the relative, TUPE and DeBERTa pages."
    cdp, sid = browser
    return {p: _visit(cdp, sid, f'{server}/{p}', CODE_BLOCKS, 1400) for p in READ_PAGES}


def _shown_cells(page):
    "Source lines of the `#| exports` cells of the notebook of `page`, without the directive, as nbdev shows them."
    nb = json.loads((NBS / page.replace('.html', '.ipynb')).read_text(encoding='utf-8'))
    cells = [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code']
    return [[l for l in c.splitlines()[1:]] for c in cells if c.splitlines()[:1] == ['#| exports']]


def _body_lines(lines):
    "Lines of a cell's function bodies: the `return` lines and other statements after a `def` line (not its signature)."
    out = []
    for l in lines:
        code = l.split('  #')[0].rstrip()
        if re.match(r'\s+return\b\s*\S', code) and len(code.strip()) > 12: out.append(code.strip())
    return out


def test_implementation_on_the_page(code_blocks):
    "On the relative, TUPE and DeBERTa pages the exported implementation is shown: the body of each exported function (its `return` lines), in a visible code block, not only its signature."
    for page, found in code_blocks.items():
        shown = _shown_cells(page)
        assert len(shown) >= 3, f'{page}: only {len(shown)} `#| exports` cells: the implementation is not on the page'
        texts = [b['text'] for b in found['blocks'] if b['visible']]
        want = [l for cell in shown for l in _body_lines(cell)]
        assert len(want) >= 5, f'{page}: only {want} body lines to look for'
        missing = [l for l in want if not any(l in t for t in texts)]
        assert not missing, f'{page}: lines of the implementation not in any visible code block: {missing[:8]}'
    deberta = ' '.join(b['text'] for b in code_blocks['08_deberta.html']['blocks'] if b['visible'])
    assert '(rel.long() + k).clamp(0, 2 * k - 1)' in deberta, "DeBERTa's δ(i,j) (eq. 3) is not on its page"


def test_code_fits_the_column(code_blocks):
    """At 1400 px no code block on the relative, TUPE and DeBERTa pages scrolls sideways, and the implementation is in
    visible blocks. Lines longer than the column (the formatter allows 110 characters, the column holds about 92)
    wrap inside their block (styles.css) instead of scrolling."""
    for page, found in code_blocks.items():
        assert found['width'] == 1400 and found['column'] > 600, f"{page}: the text column is {found['column']} px at 1400 px"
        wide = [f"{b['sw']} > {b['cw']} px: {b['text'][:80]!r}" for b in found['blocks'] if b['overflows']]
        assert not wide, f'{page}: {len(wide)} of {len(found["blocks"])} code blocks overflow the column:\n' + '\n'.join(wide[:10])
        impl = [b for b in found['blocks'] if b['visible'] and any(l in b['text'] for c in _shown_cells(page) for l in _body_lines(c))]
        assert impl, f'{page}: no visible code block holds the implementation'


def test_search_snippets_readable(site, server, browser):
    "Search results (titles, sections, snippets, highlighted words) have text contrast ≥ 4.5:1 against their background (WCAG AA)."
    cdp, sid = browser
    found = _visit(cdp, sid, f'{server}/08_deberta.html', SEARCH, 1400)
    assert 'error' not in found, found
    assert found['results'] > 0 and found['parts'], f'searching "relative" gave no results: {found}'
    kinds = {p['part'] for p in found['parts']}
    assert {'search-result-title', 'search-result-text'} <= kinds, f'search results lack titles or snippets: {kinds}'
    low = [f"{p['part']} {p['text']!r}: {p['ratio']:.2f}:1" for p in found['parts'] if p['ratio'] < 4.5]
    assert not low, 'search result text below 4.5:1 contrast:\n' + '\n'.join(low[:10])


def test_phone_width_keeps_equation_numbers(site, server, browser):
    "At 390 px the page does not scroll sideways, and every equation number is on screen or in its equation's own sideways-scrolling box, never cut off."
    cdp, sid = browser
    checked = 0
    for page in READ_PAGES:
        found = _visit(cdp, sid, f'{server}/{page}', PHONE, 390)
        assert found['pageWidth'] <= found['width'] + 1, f"{page}: the page is {found['pageWidth']} px wide at 390 px"
        for n in found['numbers']:
            checked += 1
            assert not n['clipped'], f"{page}: equation number {n['text']} is cut off by {n['clipped']}"
            assert n['inWindow'] and n['right'] <= n['reach'] + 1, f"{page}: equation number {n['text']} cannot be reached: {n}"
    assert checked >= 3, f'only {checked} numbered equations found on {READ_PAGES}'


# The studies' results tables (issue 28 item 3): HTML tables that fit the text column at 1400 px, so that a reader
# sees every column without scrolling sideways (the probe table's 10 columns once needed 848 px of a 760 px column).
TABLE_PAGES = ('30_compare.html', '33_probes.html')

TABLES = r'''(async () => {
  await document.fonts.ready;
  const main = document.querySelector('main');
  const tables = [...main.querySelectorAll('table')].map(t => ({
    caption: (t.querySelector('caption') || {textContent: ''}).textContent.trim().slice(0, 70),
    width: t.scrollWidth, box: t.parentElement.clientWidth, boxScroll: t.parentElement.scrollWidth}));
  return {width: innerWidth, column: main.clientWidth, tables};
})()'''


def test_results_tables_fit_the_column(site, server, browser):
    "At 1400 px every table on the compare and probe pages fits the text column: no table, and no box around one, scrolls sideways."
    cdp, sid = browser
    for page in TABLE_PAGES:
        found = _visit(cdp, sid, f'{server}/{page}', TABLES, 1400)
        assert found['width'] == 1400 and found['column'] > 600, f"{page}: the text column is {found['column']} px at 1400 px"
        assert found['tables'], f'{page}: no <table>: its results are not HTML tables'
        col = found['column']
        wide = [f"{t['width']} px (box {t['box']} px, column {col} px): {t['caption']!r}" for t in found['tables']
                if t['width'] > min(t['box'], col) + 1 or t['boxScroll'] > t['box'] + 1]
        assert not wide, f'{page}: {len(wide)} of {len(found["tables"])} tables wider than the column:\n' + '\n'.join(wide)
