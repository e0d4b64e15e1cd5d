#!/usr/bin/env python
"""Shorten the lines black leaves long in the notebooks' exported cells (strings, comments, docstrings).

    python tools/fix_long_lines.py NOTEBOOK ...     edit in place, then black (tools/format_nbs.py) the cells

For each exported code line over the line length of pyproject.toml [tool.black]:
- a comment line is wrapped; a trailing comment moves above its line, wrapped (fastcore's docments reads a
  parameter's comment from the lines above it too);
- a one-line string is split at spaces into adjacent literals (implicit concatenation) in parentheses;
- a docstring is wrapped at spaces (a one-line docstring becomes a triple-quoted one).
The module's AST must stay the same (docstrings compared up to whitespace), else the cell is left alone and
named. Lines it cannot shorten (long code, other multi-line strings) are listed for a hand edit.
"""

import ast
import io
import json
import sys
import textwrap
import tokenize
from pathlib import Path

import black

sys.path.insert(0, str(Path(__file__).resolve().parent))
from format_nbs import black_mode, first_code_ln, format_cell, is_exported  # noqa: E402


def _docstring_starts(tree) -> set:
    "(line, col) of every docstring's first token"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    out.add((first.lineno, first.col_offset))
    return out


def _norm(tree) -> str:
    "ast.dump with docstrings' whitespace collapsed"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    first.value.value = ' '.join(first.value.value.split())
    return ast.dump(tree)


def _split_prefix(tok: str):
    "(prefix, quote, body) of a one-line string token"
    i = 0
    while tok[i] not in '\'"':
        i += 1
    prefix = tok[:i]
    quote = tok[i : i + 3] if tok[i : i + 3] in ('"""', "'''") else tok[i]
    return prefix, quote, tok[i + len(quote) : len(tok) - len(quote)]


def _break_points(body: str, fstring: bool) -> list[int]:
    "indexes just after a space where the literal may be cut (outside {…} of an f-string, not after a backslash)"
    out, depth = [], 0
    for i, ch in enumerate(body):
        if fstring and ch == '{':
            depth += 1
        elif fstring and ch == '}':
            depth = max(depth - 1, 0)
        elif ch == ' ' and depth == 0 and i > 0 and body[i - 1] != '\\' and i + 1 < len(body):
            out.append(i + 1)
    return out


def _chunks(tok: str, width: int):
    "`tok` cut into literals of at most `width` characters of body each, or None if it cannot be cut"
    prefix, quote, body = _split_prefix(tok)
    fstring = 'f' in prefix.lower()
    points = _break_points(body, fstring)
    cuts, start = [], 0
    while len(body) - start > width:
        ok = [p for p in points if start < p <= start + width]
        if not ok:
            later = [p for p in points if p > start]
            if not later:
                break
            ok = [later[0]]
        cuts.append(ok[-1])
        start = ok[-1]
    if not cuts:
        return None
    out = []
    for a, b in zip([0] + cuts, cuts + [len(body)]):
        part = body[a:b]
        p = prefix
        if fstring and '{' not in part and '}' not in part:
            p = prefix.replace('f', '').replace('F', '')
        out.append(f'{p}{quote}{part}{quote}')
    return out


def _wrap_comment(text: str, indent: str, lim: int) -> list[str]:
    "a comment (with its '#') wrapped into lines of at most `lim` characters"
    body = text.lstrip('#').strip()
    return [
        f'{indent}# {ln}'
        for ln in textwrap.wrap(body, lim - len(indent) - 2, break_long_words=False, break_on_hyphens=False)
    ]


def _wrap_doc_line(line: str, lim: int) -> list[str]:
    "a line inside a docstring cut at spaces into lines of at most `lim` characters, each at its indent"
    indent = line[: len(line) - len(line.lstrip())]
    out = []
    while len(line) > lim:
        cut = line.rfind(' ', len(indent) + 1, lim + 1)
        if cut < 0:
            break
        out.append(line[:cut].rstrip())
        line = indent + line[cut + 1 :].lstrip()
    return out + [line]


def _single_line_statements(toks) -> set:
    "rows holding a whole logical line (a simple statement or a compound statement's header)"
    out, start = set(), None
    for t in toks:
        if t.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            continue
        if t.type == tokenize.NEWLINE:
            if start == t.start[0]:
                out.add(start)
            start = None
        elif start is None:
            start = t.start[0]
    return out


_OPEN, _CLOSE = '([{', ')]}'


def keep_comments(code: str) -> str:
    """`code` made safe for black where comments sit inside brackets (fastcore's docments): a magic trailing comma
    in each multi-line bracket holding comments (black would otherwise join the lines and run the comments
    together), and a comment after the `)` of a multi-line parameter list moved onto its last parameter (black
    would leave it on the `) -> T:` line, where docments reads it as the return's)."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(code).readline)]
    sig = [k for k, t in enumerate(toks) if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.NEWLINE)]
    prev_sig = {}
    for a, b in zip(sig, sig[1:]):
        prev_sig[b] = a
    inserts = []  # (row, col, text)
    moves = []  # (close token index, comment token index, last sig token index)
    stack = []
    for k, t in enumerate(toks):
        if t.type != tokenize.OP:
            continue
        if t.string in _OPEN:
            stack.append(k)
        elif t.string in _CLOSE and stack:
            o = stack.pop()
            inner = toks[o + 1 : k]
            depth, comments, commas, has_for = 0, False, False, False
            for x in inner:
                if x.type == tokenize.OP and x.string in _OPEN:
                    depth += 1
                elif x.type == tokenize.OP and x.string in _CLOSE:
                    depth -= 1
                elif depth == 0:
                    comments |= x.type == tokenize.COMMENT
                    commas |= x.type == tokenize.OP and x.string == ','
                    has_for |= x.type == tokenize.NAME and x.string in ('for', 'lambda')
            multi = toks[o].start[0] != t.start[0]
            before = prev_sig.get(o)
            is_def = (
                toks[o].string == '('
                and before is not None
                and toks[before].type == tokenize.NAME
                and prev_sig.get(before) is not None
                and toks[prev_sig[before]].string == 'def'
            )
            last = prev_sig.get(k)
            if last is None or last == o or has_for:
                continue
            opener_kind = toks[before].type if before is not None else None
            call_or_sub = opener_kind == tokenize.NAME or (before is not None and toks[before].string in ')]')
            if toks[o].string == '(' and not is_def and not call_or_sub and not commas:
                continue  # a parenthesised expression, not a tuple
            if toks[o].string == '[' and call_or_sub and not commas:
                continue  # a subscript with one index
            after = [x for x in toks[k + 1 :] if x.start[0] == t.start[0]]
            trailing = [
                j
                for j, x in enumerate(toks[k + 1 :], k + 1)
                if x.start[0] == t.start[0] and x.type == tokenize.COMMENT
            ]
            arrow = any(x.string == '->' for x in after)
            if is_def and multi and trailing and toks[last].start[0] == t.start[0] and not arrow:
                moves.append((k, trailing[0], last))
            elif multi and (comments or (is_def and trailing)) and toks[last].string != ',':
                inserts.append((toks[last].end[0], toks[last].end[1], ','))
    lines = code.split('\n')
    for k, c, last in sorted(moves, reverse=True):
        row = toks[k].start[0]
        line = lines[row - 1]
        comment = toks[c].string
        head = line[: toks[last].end[1]]
        comma = '' if toks[last].string == ',' else ','
        tail = line[toks[k].start[1] : toks[c].start[1]].rstrip()
        indent = line[: len(line) - len(line.lstrip())]
        lines[row - 1 : row] = [head + comma + '  ' + comment, indent + tail]
    moved_rows = {toks[k].start[0] for k, _, _ in moves}
    for row, col, text in sorted(inserts, reverse=True):
        if row in moved_rows:
            continue
        line = lines[row - 1]
        lines[row - 1] = line[:col] + text + line[col:]
    return '\n'.join(lines)


def fix_code(code: str, lim: int, comments_only: bool = False):
    """`code` with its long lines shortened where possible, and whether the AST stayed the same.
    `comments_only`: only move the trailing comments of one-line statements (before black, which would split
    the code to make room for the comment)."""
    lines = code.split('\n')
    tree = ast.parse(code)
    docs = _docstring_starts(tree)
    toks = list(tokenize.generate_tokens(io.StringIO(code).readline))
    whole = _single_line_statements(toks)
    edits = {}  # line number (1-based) -> replacement lines
    stack, stmt_row = [], None
    for k, t in enumerate(toks):
        row, col = t.start
        if t.type == tokenize.OP and t.string in _OPEN:
            stack.append(t)
        elif t.type == tokenize.OP and t.string in _CLOSE and stack:
            stack.pop()
        if t.type == tokenize.NEWLINE:
            stmt_row = None
        elif stmt_row is None and t.type not in (
            tokenize.NL,
            tokenize.COMMENT,
            tokenize.INDENT,
            tokenize.DEDENT,
        ):
            stmt_row = row
        if row > len(lines) or row in edits:
            continue
        line = lines[row - 1]
        if comments_only and t.type == tokenize.COMMENT and stack and row not in whole and line[:col].strip():
            # a comment inside brackets, before black: move it above its element if black's line would be long
            top = stack[-1]
            sl = lines[(stmt_row or row) - 1]
            inner = ' ' * (len(sl) - len(sl.lstrip()) + 4)
            seg = line[top.end[1] : col].strip() if top.start[0] == row else line[:col].strip()
            if len(inner) + len(seg) + 2 + len(t.string) + 4 > lim and seg:
                wrapped = _wrap_comment(t.string, inner, lim)
                if top.start[0] == row:
                    edits[row] = [line[: top.end[1]]] + wrapped + [inner + seg]
                else:
                    edits[row] = wrapped + [line[:col].rstrip()]
            continue
        if comments_only and t.type != tokenize.COMMENT:
            continue
        if t.type == tokenize.COMMENT and len(line) > lim:
            indent = line[: len(line) - len(line.lstrip())]
            before = line[:col].rstrip()
            if not before:
                edits[row] = _wrap_comment(t.string, indent, lim)
            elif row in whole or (len(before) <= lim and not comments_only):
                edits[row] = _wrap_comment(t.string, indent, lim) + [before]
        elif t.type == tokenize.STRING and t.start[0] != t.end[0] and (row, col) in docs:
            for r in range(t.start[0], t.end[0] + 1):
                if len(lines[r - 1]) > lim and r not in edits:
                    edits[r] = _wrap_doc_line(lines[r - 1], lim)
        elif t.type == tokenize.STRING and t.start[0] == t.end[0] and len(line) > lim:
            indent = line[: len(line) - len(line.lstrip())]
            if (row, col) in docs:
                prefix, quote, body = _split_prefix(t.string)
                if body.endswith('"') or '"""' in body or 'b' in prefix.lower():
                    continue
                wrapped = textwrap.wrap(
                    body,
                    lim - len(indent),
                    break_long_words=False,
                    break_on_hyphens=False,
                    initial_indent='"""',
                    drop_whitespace=True,
                )
                if len(wrapped) < 2:
                    continue
                new = [line[:col] + prefix + wrapped[0]] + [indent + w for w in wrapped[1:]]
                new[-1] += '"""' + line[t.end[1] :]
                edits[row] = new
                continue
            prev = next(
                (x for x in reversed(toks[:k]) if x.type not in (tokenize.NL, tokenize.COMMENT)), None
            )
            nxt = next((x for x in toks[k + 1 :] if x.type not in (tokenize.NL, tokenize.COMMENT)), None)
            in_seq = (prev is not None and prev.type == tokenize.STRING) or (
                nxt is not None and nxt.type == tokenize.STRING
            )
            # the only argument of a call: black splits the literals inside its brackets, no parentheses needed
            sole = prev is not None and nxt is not None and prev.string == '(' and nxt.string == ')'
            in_seq = in_seq or sole
            prefix, quote, body = _split_prefix(t.string)
            width = lim - len(indent) - 8 - len(prefix) - 2 * len(quote)
            parts = _chunks(t.string, max(width, 20))
            if parts is None:
                continue
            inner = indent + ' ' * 4
            if in_seq:
                new = line[:col] + parts[0]
                rest = [inner + p for p in parts[1:]]
                rest[-1] += line[t.end[1] :]
                edits[row] = [new] + rest
            else:
                rest = [inner + p for p in parts]
                edits[row] = [line[:col] + '('] + rest + [indent + ')' + line[t.end[1] :]]
    for row in sorted(edits, reverse=True):
        lines[row - 1 : row] = edits[row]
    new = '\n'.join(lines)
    try:
        ok = _norm(ast.parse(new)) == _norm(tree)
    except SyntaxError:
        ok = False
    if not ok:
        return code, False
    return new, True


def _join_pieces(toks):
    "the body of one f-string (or plain string) equal to the concatenation of `toks`, or None"
    parts, any_f = [], False
    for t in toks:
        prefix, quote, body = _split_prefix(t.string)
        if set(prefix.lower()) - {'f'} or len(quote) == 3:
            return None
        f = 'f' in prefix.lower()
        any_f |= f
        parts.append((f, quote, body))
    out = []
    for f, quote, body in parts:
        if any_f and not f:
            body = body.replace('{', '{{').replace('}', '}}')
        out.append(body)
    return ''.join(out), any_f


def _quote(body: str, f: bool):
    "a literal holding `body` (raw source text of a body), or None if no quote fits"
    bare = body.replace('\\\\', '').replace("\\'", '').replace('\\"', '')
    prefix = 'f' if f and ('{' in body or '}' in body) else ''
    if "'" not in bare:
        return f"{prefix}'{body}'"
    if '"' not in bare:
        return f'{prefix}"{body}"'
    return None


def rechunk_strings(code: str, lim: int, short: int = 30) -> str:
    """Implicitly concatenated literals over several lines re-cut at spaces into even pieces (no short fragments
    left by earlier cuts); the value is unchanged (checked by the caller)."""
    toks = list(tokenize.generate_tokens(io.StringIO(code).readline))
    runs, cur = [], []
    for t in toks:
        if t.type == tokenize.STRING:
            cur.append(t)
        elif t.type == tokenize.NL:
            continue
        else:
            if len(cur) > 1:
                runs.append(cur)
            cur = []
    lines = code.split('\n')
    for run in reversed(runs):
        r0, c0 = run[0].start
        r1, c1 = run[-1].end
        bodies = [_split_prefix(t.string)[2] for t in run]
        longest = max(len(lines[r - 1]) for r in range(r0, r1 + 1))
        frag = any(len(b) < short and not b.endswith('\\n') for b in bodies[:-1])
        if not frag and longest <= lim:
            continue
        joined = _join_pieces(run)
        if joined is None:
            continue
        body, f = joined
        width = lim - c0 - 6 if c0 < lim - 40 else lim - 48
        pieces = _chunks(("f'" if f else "'") + body + "'", width)
        if pieces is None:
            continue
        bodies = [_split_prefix(p)[2] for p in pieces]
        quoted = [_quote(b, f) for b in bodies]
        if None in quoted:
            continue
        head, tail = lines[r0 - 1][:c0], lines[r1 - 1][c1:]
        new = [head + quoted[0]] + [' ' * c0 + q for q in quoted[1:]]
        new[-1] += tail
        lines[r0 - 1 : r1] = new
    return '\n'.join(lines)


def fix_notebook(path: Path, lim: int, mode) -> list[str]:
    "Shorten and black the exported cells of `path` in place; return the long lines left, as 'notebook cell: line'"
    nb = json.loads(path.read_text())
    left = []
    for cell in nb['cells']:
        if not is_exported(cell):
            continue
        src = ''.join(cell['source'])
        lines = src.splitlines(True)
        first = first_code_ln(lines)
        if first is not None:
            code = ''.join(lines[first:])
            safe = keep_comments(code)
            if _norm(ast.parse(safe)) != _norm(ast.parse(code)):
                print(f'{path.name} cell {cell.get("id")}: keep_comments changed the AST; not applied')
                safe = code
            lines = (''.join(lines[:first]) + safe).splitlines(True)
            new, ok = fix_code(''.join(lines[first:]), lim, comments_only=True)
            if ok:
                src = ''.join(lines[:first]) + new
        for _ in range(4):
            src = format_cell(src, mode)
            lines = src.splitlines(True)
            first = first_code_ln(lines)
            if first is None or max(len(ln.rstrip('\n')) for ln in lines[first:]) <= lim:
                break
            head, code = ''.join(lines[:first]), ''.join(lines[first:])
            new, ok = fix_code(code, lim)
            if ok:
                again = rechunk_strings(new, lim)
                if _norm(ast.parse(again)) == _norm(ast.parse(code)):
                    new = again
            if not ok:
                print(f'{path.name} cell {cell.get("id")}: a fix changed the AST; cell left as black left it')
                break
            if new == code:
                break
            src = head + new
        src = format_cell(src, mode)
        lines = src.splitlines(True)
        first = first_code_ln(lines)
        if first is not None:
            code = ''.join(lines[first:])
            again = rechunk_strings(code, lim)
            if again != code and _norm(ast.parse(again)) == _norm(ast.parse(code)):
                src = format_cell(''.join(lines[:first]) + again, mode)
        cell['source'] = src.splitlines(True)
        left += [f'{path.name} {cell.get("id")}: {ln.rstrip()}' for ln in src.splitlines() if len(ln) > lim]
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    return left


if __name__ == '__main__':
    mode = black_mode()
    left = []
    for p in sys.argv[1:]:
        left += fix_notebook(Path(p), mode.line_length, mode)
    print('\n'.join(left))
    print(f'{len(left)} line(s) over {mode.line_length} left', file=sys.stderr)
