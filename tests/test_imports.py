"""No import cycle in the package (issue 25): the module-level imports between posenc_lit's modules form a DAG, and
each module imports alone, in dependency order, into an interpreter that has loaded no posenc_lit module (a cycle, or
a module that works only after another was imported, fails here)."""
import ast, graphlib, subprocess, sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / 'posenc_lit'


def module_graph() -> dict:
    "{module: the package modules it imports at module level} from the source (relative and absolute imports)."
    mods = {p.stem for p in PKG.glob('*.py') if p.stem != '_modidx'}
    graph = {}
    for m in mods:
        deps = set()
        for node in ast.parse((PKG / f'{m}.py').read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split('.')[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('posenc_lit'):
                parts = node.module.split('.')
                deps |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name.split('.')[1] for a in node.names if a.name.startswith('posenc_lit.')}
        graph[m] = deps & mods - {m}
    return graph


def test_module_imports_form_a_dag():
    order = list(graphlib.TopologicalSorter(module_graph()).static_order())   # CycleError names the cycle
    assert order.index('core') < order.index('attention') < order.index('model') < order.index('training')


def test_graph_sees_an_import():
    """The graph is not empty by mistake: the model imports the core, the training code the model; the core sits at
    the bottom, importing at most leaf modules that import no other module of the package (`checks`)."""
    g = module_graph()
    assert 'core' in g['model'] and 'model' in g['training'], g
    assert all(not g[d] for d in g['core'] - {'__init__'}), {d: g[d] for d in g['core']}


# One interpreter loads the third-party libraries (torch alone takes seconds), then forks a child per module: each
# child starts with no posenc_lit module loaded and imports one, as a fresh interpreter would.
_FORKS = r"""
import importlib, os, sys, traceback
import torch, numpy, matplotlib.pyplot, accelerate, datasets, tokenizers, safetensors, sklearn, scipy, tqdm
import fastcore.basics
assert not [m for m in sys.modules if m.startswith('posenc_lit')]
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
            os._exit(0)
        except BaseException:
            sys.stderr.write(f'@@{name}\n' + traceback.format_exc()[-800:])
            sys.stderr.flush()
            os._exit(1)
    if os.waitpid(pid, 0)[1]:
        print(name, flush=True)
"""


def test_each_module_imports_alone_in_a_fresh_interpreter():
    order = list(graphlib.TopologicalSorter(module_graph()).static_order())
    names = ['posenc_lit' if m == '__init__' else f'posenc_lit.{m}' for m in order]
    env = {'OMP_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'PATH': '/usr/bin:/bin', 'MPLBACKEND': 'Agg'}
    r = subprocess.run([sys.executable, '-c', _FORKS, *names], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    failed = r.stdout.split()
    assert not failed, (failed, r.stderr[-3000:])


def test_a_module_that_fails_to_import_is_reported():
    "The forks can fail: a module that does not exist is named."
    r = subprocess.run([sys.executable, '-c', _FORKS, 'posenc_lit.core', 'posenc_lit.no_such_module'],
                       capture_output=True, text=True, env={'PATH': '/usr/bin:/bin', 'MPLBACKEND': 'Agg'})
    assert r.returncode == 0 and r.stdout.split() == ['posenc_lit.no_such_module'], (r.stdout, r.stderr[-800:])
