"""Fixtures shared by the docs tests: the offline site, built once per test session.

`site` runs `tools/build_docs.sh` the first time a test asks for it (test_docs.py, test_browser.py) and hands the
same `_site/` to every later test; a failed build fails each of them with the build's errors, without rebuilding.
POSENC_LIT_SITE=DIR skips the build and tests the site already built in DIR (e.g. `_site`, or a copy of it; for
working on the tests themselves -- CI never sets it).
"""
import ast, importlib.util, json, os, re, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PREBUILT = os.environ.get('POSENC_LIT_SITE')
NBS, SITE = ROOT / 'nbs', (Path(PREBUILT).resolve() if PREBUILT else ROOT / '_site')
BUILD_TIMEOUT = int(os.environ.get('DOCS_BUILD_TIMEOUT', 900))  # seconds for the whole build

_build = {}  # the build's outcome, so that a failed build runs once, not once per test


def notebooks():
    "The notebooks that become pages: every .ipynb under nbs/ with no part starting with `_` or `.` (nbdev's rule)."
    return sorted(p for p in NBS.rglob('*.ipynb') if not any(s[0] in '_.' for s in p.relative_to(NBS).parts))


def page_of(nb):
    "The offline site's page of notebook `nb` (smalldocs names pages after the files)."
    return SITE / nb.relative_to(NBS).with_suffix('.html')


def quarto_pages():
    "{Quarto page name (nbdev's `output-file`, e.g. `core.html`): the offline site's page (`00_core.html`)}."
    # nbdev's rule (nbdev.doclinks._nbpath2html): the file name, lower-cased, without its `NN_` prefix
    return {(nb.relative_to(NBS).parent / (re.sub(r'^\d+[a-zA-Z0-9]*_', '', nb.name.lower())[:-6] + '.html')).as_posix():
            nb.relative_to(NBS).with_suffix('.html').as_posix() for nb in notebooks()}


def exported(module):
    "The names in `__all__` of a posenc_lit module, read from its source (nothing is imported)."
    tree = ast.parse((ROOT / (module.replace('.', '/') + '.py')).read_text(encoding='utf-8'))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == '__all__' for t in node.targets):
            return ast.literal_eval(node.value)
    return []


def build_site():
    "Run tools/build_docs.sh once; return None, or the error to report."
    if PREBUILT: return None if (SITE / 'index.html').exists() else f'POSENC_LIT_SITE={PREBUILT}, but it has no index.html'
    env = {**os.environ, 'PYTHON': sys.executable,
           'PATH': str(Path(sys.executable).parent) + os.pathsep + os.environ.get('PATH', '')}
    r = subprocess.run(['bash', str(ROOT / 'tools' / 'build_docs.sh')], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=BUILD_TIMEOUT)
    out = r.stdout + r.stderr
    print('\n' + '\n'.join(l for l in out.splitlines() if re.match(r'built \d+ pages|   \d+ page', l)))   # with -s: pages, times
    causes = '\n'.join(dict.fromkeys(l for l in out.splitlines() if re.match(r'^[\w.]*(Error|Exception)\b', l)))
    return None if r.returncode == 0 else \
        f'tools/build_docs.sh failed ({r.returncode}); errors:\n{causes}\n--- last output:\n{out[-3000:]}'


@pytest.fixture(scope='session')
def site():
    """The built offline site, `_site/` (built on first use, once per test run). Under pytest-xdist (tools/test.sh runs
    two workers) the first worker to ask builds it while the other waits on a lock, then reads the outcome."""
    pytest.importorskip('smalldocs', reason='smalldocs is not installed (pip install -e ".[dev]"): the offline docs build needs it')
    if 'error' not in _build: _build['error'] = _shared_build()
    if _build['error']: pytest.fail(_build['error'], pytrace=False)
    return SITE


def _shared_build():
    "build_site() once per test run, shared by the xdist workers through a lock and a file holding the outcome."
    run = os.environ.get('PYTEST_XDIST_TESTRUNUID')
    if not run: return build_site()
    from filelock import FileLock
    outcome = ROOT / f'.site-build-{run}.json'
    with FileLock(str(ROOT / '.site-build.lock')):
        if not outcome.exists():
            for old in ROOT.glob('.site-build-*.json'): old.unlink()
            outcome.write_text(json.dumps({'error': build_site()}))
        return json.loads(outcome.read_text())['error']


def cut_with_sigterm(cmd, run_dir, env, steps: int) -> int:
    """Start the training command `cmd`, send it SIGTERM after its third training record, and check the interruption:
    status 143, the notice on stdout, no traceback, a checkpoint mid-run. Returns the step the checkpoint holds."""
    import json, signal, time
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics, t0 = Path(run_dir) / 'metrics.jsonl', time.time()
    # records exist only inside the loop; a ViT record says "train" twice (split and phase): count the split
    while not (metrics.is_file() and metrics.read_text().count('"split": "train"') >= 3):
        # a guard against a hang, not a timing: startup alone took over 120 s at a load average of 10
        assert p.poll() is None and time.time() - t0 < 600, p.communicate()
        time.sleep(0.005)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, out, err[-2000:])
    assert 'interrupted by SIGTERM' in out and 'Traceback' not in err
    k = json.loads((Path(run_dir) / 'checkpoint' / 'trainer_state.json').read_text())['step']
    assert 3 <= k < steps, f'the signal landed at step {k}, not mid-run'
    return k


def write_small_corpus(d, train: int, validation: int) -> str:
    "Write the first `train` / `validation` records of the embedded corpus into folder `d` (the local-folder schema)."
    import gzip
    from posenc_lit.data import corpus_dir
    for split, n in (('train', train), ('validation', validation)):
        with gzip.open(corpus_dir() / f'{split}.jsonl.gz', 'rt') as f:
            lines = [next(f) for _ in range(n)]
        (Path(d) / f'{split}.jsonl').write_text(''.join(lines))
    return str(d)


def free_port() -> int:
    "A free TCP port on 127.0.0.1, for `accelerate launch --main_process_port` (two runs at once must not share 29500)."
    import socket
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.fixture
def stand_in(tmp_path):
    """`(env, called)`: the environment of a lane script (tools/run_*.sh) whose `posenc_lit` is a stand-in that
    appends its arguments to the file `called` and fails; results go under `tmp_path` (STUDY_ROOT), nothing is
    committed (COMMIT=0)."""
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    called = tmp_path / 'called'
    (bin_ / 'posenc_lit').write_text(f'#!/bin/sh\necho "$@" >> {called}\nexit 1\n')
    (bin_ / 'posenc_lit').chmod(0o755)
    path = f'{bin_}:{Path(sys.executable).parent}:{os.environ["PATH"]}'
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, 'PATH': path, 'STUDY_ROOT': str(tmp_path), 'COMMIT': '0', 'PYTHONPATH': root}
    return env, called


def load_tool(name: str):
    "The module `tools/<name>.py` (a golden-file maker: tools/ is not a package), loaded from its file."
    spec = importlib.util.spec_from_file_location(name, ROOT / 'tools' / f'{name}.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_golden(golden: Path, ref: tuple, check):
    "`check(tensors)` on the golden file `golden`, after its metadata name `ref`'s repository and commit."
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(golden), 'pt') as f:
        assert (f.metadata()['repository'], f.metadata()['commit']) == (ref[0], ref[2])
    check(load_file(str(golden)))


def check_live(loaded: tuple, ref: tuple, env: str, goldens, check, what: str):
    """`check(goldens(module))` with the reference module of `loaded` (`(module, path)` from a tool's loader);
    skipped, saying how to point `env` at `ref` (repository, path, commit), where it is not here."""
    module, path = loaded
    if module is None:
        repo, file, commit = ref
        pytest.skip(f'{what} is not here: set ${env} to {repo}@{commit[:8]}:{file} (got {path!r}; see '
                    'tools/make_fire_cope_goldens.py); the golden file checks the same')
    check(goldens(module))
