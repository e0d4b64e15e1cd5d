"""Notebooks run top to bottom in JupyterLab, through a real Jupyter client, not only in nbdev's own runner.

`nbdev_test` (tools/test.sh) already runs every notebook once; this second run, through another client, is for a
few by default (`DEFAULT`: the core, the own-attention contract, a results page with tables and figures, the front
page), so the test command stays within its time. `JUPYTER_TEST_NOTEBOOKS=all` runs every notebook.

A JupyterLab server is started on 127.0.0.1 (a free port, a random token, a throw-away Jupyter config). Each
notebook is opened through the server's contents API, gets a session with a fresh kernel (`/api/sessions`), and its
code cells are sent one by one as `execute_request`s over the kernel's websocket (the Jupyter messaging protocol,
as JupyterLab itself speaks it); a cell that replies with an error fails the notebook. Cells are skipped the way
`nbdev_test` skips them: `#| eval: false`, cells that call `nbdev_export(`, and cells flagged with a `tst_flags`
flag of settings.ini (`#| slow`) unless JUPYTER_TEST_FLAGS names it; a notebook with `skip_exec: true` front matter
is skipped.

Env: JUPYTER_TEST_NOTEBOOKS  space-separated names or globs to run, or "all" (default: `DEFAULT`)
     JUPYTER_TEST_WORKERS    notebooks run at once (default 2: the machine's two cores, one torch thread each)
     JUPYTER_TEST_TIMEOUT    seconds per notebook (default 900)
     JUPYTER_TEST_FLAGS      tst_flags to run anyway (e.g. "slow")
The kernels run with OMP_NUM_THREADS=1 and Hugging Face offline, as tools/test.sh runs nbdev_test.
"""
import configparser, fnmatch, json, os, re, secrets, shutil, socket, subprocess, sys, tempfile, time, uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import NBS, ROOT, notebooks

if not os.environ.get('CI'):   # in CI the dev extras are installed, and a missing one must fail, not skip
    pytest.importorskip('jupyterlab', reason='jupyterlab is not installed (pip install -e ".[dev]")')
    pytest.importorskip('websocket', reason='websocket-client is not installed (pip install -e ".[dev]")')
import requests, websocket

TIMEOUT = int(os.environ.get('JUPYTER_TEST_TIMEOUT', 900))
WORKERS = int(os.environ.get('JUPYTER_TEST_WORKERS', 2))
_re_ansi = re.compile(r'\x1b\[[0-9;]*[A-Za-z]')


DEFAULT = '00_core 02_your_attention 35_study index'


def selected():
    "The notebooks to run: those JUPYTER_TEST_NOTEBOOKS names (`DEFAULT` if unset), or all of them for 'all'."
    pats = (os.environ.get('JUPYTER_TEST_NOTEBOOKS') or DEFAULT).split()
    nbs = [nb.relative_to(NBS).as_posix() for nb in notebooks()]
    if pats == ['all']: return nbs
    pick = [n for n in nbs if any(fnmatch.fnmatch(n, p) or fnmatch.fnmatch(n, p + '.ipynb') or n.startswith(p + '_') for p in pats)]
    assert pick, f'JUPYTER_TEST_NOTEBOOKS={pats} matches no notebook of {nbs}'
    return pick


def skip_flags():
    "nbdev's rule: the `tst_flags` of settings.ini, less the flags asked for."
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT / 'settings.ini', encoding='utf-8')
    return set(cfg['DEFAULT'].get('tst_flags', '').split()) - set(os.environ.get('JUPYTER_TEST_FLAGS', '').split())


def cells_to_run(nb: dict, path: str, flags: set):
    "[(index, source)] of the code cells nbdev_test would run, or None for a notebook it skips (nbdev's own parser)."
    from execnb.nbio import dict2nb
    from fastcore.xtras import str2bool
    from nbdev.frontmatter import FrontmatterProc
    from nbdev.process import NBProcessor
    fm_nb = dict2nb(json.loads(json.dumps(nb)))
    fm_nb.path_ = path
    NBProcessor(nb=fm_nb, procs=FrontmatterProc, process=True)          # reads the front matter (skip_exec)
    if str2bool(getattr(fm_nb, 'frontmatter_', {}).get('skip_exec', False)): return None
    out = []
    for i, cell in enumerate(NBProcessor(nb=dict2nb(json.loads(json.dumps(nb))), rm_directives=False).nb.cells):
        if cell.cell_type != 'code': continue
        d = getattr(cell, 'directives_', {}) or {}
        if 'nbdev_export(' in cell.source or d.get('eval:', [''])[0].lower() == 'false' or flags & d.keys(): continue
        out.append((i, cell.source))
    return out


# ---------------------------------------------------------------------------------------------------------------
# JupyterLab on loopback

def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, url, token, proc):
        self.url, self.token, self.proc = url, token, proc
        self.http = requests.Session()
        self.http.headers['Authorization'] = f'token {token}'
        self.http.trust_env = False   # no proxies: loopback only

    def api(self, method, path, **kw):
        r = self.http.request(method, f'{self.url}{path}', timeout=60, **kw)
        r.raise_for_status()
        return r.json() if r.content else None


@pytest.fixture(scope='module')
def lab():
    token, port, home = secrets.token_hex(24), _free_port(), Path(tempfile.mkdtemp(prefix='posenc_lit_jupyter.'))
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1',
           'TOKENIZERS_PARALLELISM': 'false', 'IN_TEST': '1',   # IN_TEST: as nbdev_test sets it
           'JUPYTER_CONFIG_DIR': str(home / 'config'), 'JUPYTER_RUNTIME_DIR': str(home / 'runtime'),
           'IPYTHONDIR': str(home / 'ipython'), 'PATH': str(Path(sys.executable).parent) + os.pathsep + os.environ.get('PATH', '')}
    cmd = [sys.executable, '-m', 'jupyterlab', '--no-browser', '--ip=127.0.0.1', f'--port={port}', '--port-retries=0',
           f'--ServerApp.token={token}', '--allow-root', f'--ServerApp.root_dir={ROOT}', '--ServerApp.terminals_enabled=False',
           '--LabApp.news_url=', '--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate']
    log = open(home / 'server.log', 'w')
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    lab = Lab(f'http://127.0.0.1:{port}', token, proc)
    deadline = time.monotonic() + 90
    while True:
        try:
            lab.api('GET', '/api/status'); break
        except requests.RequestException:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill(); log.close()
                pytest.fail(f'JupyterLab did not start:\n{(home / "server.log").read_text()[-3000:]}', pytrace=False)
            time.sleep(0.3)
    try: yield lab
    finally:
        proc.terminate()
        try: proc.wait(20)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()
        log.close()
        shutil.rmtree(home, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# A Jupyter client on the kernel's websocket

class KernelClient:
    "The Jupyter messaging protocol (v5.3) over jupyter_server's kernel websocket (JSON frames with a `channel`)."
    def __init__(self, lab, kernel_id):
        self.session = uuid.uuid4().hex
        url = lab.url.replace('http', 'ws', 1) + f'/api/kernels/{kernel_id}/channels?session_id={self.session}'
        self.ws = websocket.create_connection(url, header=[f'Authorization: token {lab.token}'], timeout=60)

    def send(self, msg_type, content, channel='shell'):
        mid = uuid.uuid4().hex
        self.ws.send(json.dumps({
            'header': {'msg_id': mid, 'msg_type': msg_type, 'session': self.session, 'username': 'posenc_lit-test',
                       'date': datetime.now(timezone.utc).isoformat(), 'version': '5.3'},
            'parent_header': {}, 'metadata': {}, 'content': content, 'channel': channel, 'buffers': []}))
        return mid

    def request(self, msg_type, content, reply_type, deadline):
        "Send a shell request; wait for its reply and for the kernel to go idle. Returns (reply content, error outputs)."
        mid, reply, idle, errors = self.send(msg_type, content), None, False, []
        while reply is None or not idle:
            left = deadline - time.monotonic()
            if left <= 0: raise TimeoutError
            self.ws.settimeout(left)
            try: raw = self.ws.recv()
            except websocket.WebSocketTimeoutException: raise TimeoutError from None
            if not isinstance(raw, str): continue                # binary frames carry buffers (widgets): not ours
            m = json.loads(raw)
            if m.get('parent_header', {}).get('msg_id') != mid: continue
            t = m['header']['msg_type']
            if t == reply_type: reply = m['content']
            elif t == 'status' and m['content'].get('execution_state') == 'idle': idle = True
            elif t == 'error': errors.append(m['content'])
        return reply, errors

    def close(self): self.ws.close()


def run_notebook(lab, name, flags):
    "Run notebook `name` in a fresh kernel of a new session; returns (status, seconds, message)."
    t0, path = time.monotonic(), f'nbs/{name}'
    model = lab.api('GET', f'/api/contents/{path}', params={'content': 1, 'type': 'notebook'})   # open it as JupyterLab does
    cells = cells_to_run(model['content'], str(ROOT / path), flags)
    if cells is None: return 'skipped', 0.0, 'skip_exec'
    sess = lab.api('POST', '/api/sessions', json={'path': path, 'name': Path(name).name, 'type': 'notebook',
                                                  'kernel': {'name': 'python3'}})
    client, deadline = None, time.monotonic() + TIMEOUT
    try:
        client = KernelClient(lab, sess['kernel']['id'])
        info, _ = client.request('kernel_info_request', {}, 'kernel_info_reply', time.monotonic() + 120)
        assert info and info.get('status', 'ok') == 'ok', info
        for i, src in cells:
            try:
                reply, errors = client.request('execute_request', {'code': src, 'silent': False, 'store_history': True,
                                               'user_expressions': {}, 'allow_stdin': False, 'stop_on_error': True},
                                               'execute_reply', deadline)
            except TimeoutError:
                return 'failed', time.monotonic() - t0, f'cell {i} still running after the notebook timeout ({TIMEOUT} s):\n{src[:600]}'
            if reply.get('status') != 'ok' or errors:
                e = (errors or [reply])[0]
                tb = _re_ansi.sub('', '\n'.join(e.get('traceback', [])))
                return 'failed', time.monotonic() - t0, (f"cell {i} raised {e.get('ename')}: {e.get('evalue')}\n--- cell:\n"
                                                         f"{src[:600]}\n--- traceback (end):\n{tb[-2500:]}")
        return 'passed', time.monotonic() - t0, f'{len(cells)} cells'
    finally:
        if client: client.close()
        try: lab.api('DELETE', f"/api/sessions/{sess['id']}")   # shuts the kernel down
        except requests.RequestException: pass


@pytest.fixture(scope='module')
def results(lab):
    "{notebook: (status, seconds, message)}: every selected notebook, WORKERS at a time."
    names, flags, t0 = selected(), skip_flags(), time.monotonic()
    with ThreadPoolExecutor(WORKERS) as ex:
        out = dict(zip(names, ex.map(lambda n: run_notebook(lab, n, flags), names)))
    times = ', '.join(f'{n} {s:.0f} s' for n, (_, s, _) in sorted(out.items(), key=lambda kv: -kv[1][1]))
    print(f'\nJupyterLab ran {len(out)} notebooks in {time.monotonic() - t0:.0f} s ({WORKERS} at a time): {times}')
    return out


def test_lab_serves_jupyterlab(lab):
    "The server is JupyterLab (its page and its API), reachable on loopback only with the token."
    r = lab.http.get(f'{lab.url}/lab', timeout=60)
    assert r.status_code == 200 and 'JupyterLab' in r.text, r.text[:300]
    assert requests.get(f'{lab.url}/api/contents/nbs', timeout=60).status_code == 403, 'the API answers without the token'
    listing = {c['name'] for c in lab.api('GET', '/api/contents/nbs')['content']}
    assert {nb.name for nb in notebooks()} <= listing, listing
    assert lab.api('GET', '/api/kernelspecs')['kernelspecs'].get('python3'), 'no python3 kernel'


@pytest.mark.parametrize('name', selected())
def test_notebook_runs_in_jupyterlab(results, name):
    status, secs, msg = results[name]
    if status == 'skipped': pytest.skip(f'{name}: {msg}')
    assert status == 'passed', f'{name} failed under a real Jupyter client after {secs:.0f} s:\n{msg}'
