"""No import cycle in the package (issue 25): the module-level imports between posenc_lit's modules form a DAG, and
each module imports alone in a fresh interpreter, in dependency order (a cycle, or a module that works only after
another was imported, fails here)."""
import ast, graphlib, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
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
    "The graph is not empty by mistake: the model imports the core, the training code the model."
    g = module_graph()
    assert 'core' in g['model'] and 'model' in g['training'] and not g['core'] - {'__init__'}


def _import_alone(m: str):
    name = 'posenc_lit' if m == '__init__' else f'posenc_lit.{m}'
    r = subprocess.run([sys.executable, '-c', f'import {name}'], capture_output=True, text=True,
                       env={'OMP_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'PATH': '/usr/bin:/bin'})
    return m, r.returncode, r.stderr[-800:]


def test_each_module_imports_alone_in_a_fresh_interpreter():
    order = list(graphlib.TopologicalSorter(module_graph()).static_order())
    with ThreadPoolExecutor(2) as pool:
        failed = [(m, err) for m, rc, err in pool.map(_import_alone, order) if rc]
    assert not failed, failed
