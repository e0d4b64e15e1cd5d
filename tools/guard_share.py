"""The share of guard lines in each module of the package (issue 39, item 2).

    python tools/guard_share.py [MODULE ...]      (default: every module of posenc_lit but _modidx)

Guard lines: an `if` whose body only raises (with its raise), asserts, statement calls to functions named
check*/_check*, and the bodies of functions named so; over the module's non-blank, non-comment lines.
"""
import ast, io, sys, tokenize
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / 'posenc_lit'
SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def code_lines(src: str) -> set:
    out = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in SKIP:
            out.update(range(tok.start[0], tok.end[0] + 1))
    return out


def _named_check(name: str) -> bool:
    return name.lstrip('_').startswith('check')


def guard_lines(tree: ast.AST) -> set:
    out = set()
    for n in ast.walk(tree):
        raises = isinstance(n, ast.If) and n.body and not n.orelse
        if raises and all(isinstance(s, ast.Raise) for s in n.body) or isinstance(n, ast.Assert):
            out.update(range(n.lineno, n.end_lineno + 1))
        elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call):
            f = n.value.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ''
            if _named_check(name):
                out.update(range(n.lineno, n.end_lineno + 1))
        elif isinstance(n, ast.FunctionDef) and _named_check(n.name):
            out.update(range(n.lineno, n.end_lineno + 1))
    return out


def main(names: list[str]) -> None:
    every = sorted(p for p in PKG.glob('*.py') if not p.name.startswith('_'))
    files = [PKG / f'{m}.py' for m in names] or every
    for p in files:
        src = p.read_text()
        code = code_lines(src)
        guards = guard_lines(ast.parse(src)) & code
        print(f'{p.stem:16s} {len(code):5d} {len(guards):4d} {100 * len(guards) / max(1, len(code)):5.1f}%')


if __name__ == '__main__':
    main(sys.argv[1:])
