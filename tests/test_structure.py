"""The project's structure rules, checked on the source: parsed options are read,
never written, outside opts.py; the library never imports util_scripts; no
function is longer than 60 lines (the option table excepted)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTION_NAMES = {'opt', 'opts', 'args'}
MAX_FUNCTION_LINES = 60


def _sources(exclude=('tests',)):
    for path in sorted(ROOT.rglob('*.py')):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in exclude or any(p.startswith('.') or p in ('venv', 'data', 'results')
                                          for p in rel.parts):
            continue
        yield rel, ast.parse(path.read_text())


def _option_writes(tree):
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                    t.value.id in OPTION_NAMES:
                yield node.lineno, f'{t.value.id}.{t.attr}'
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == 'setattr' and node.args and \
                isinstance(node.args[0], ast.Name) and node.args[0].id in OPTION_NAMES:
            yield node.lineno, 'setattr'


def test_options_are_not_written_after_parsing():
    found = [f'{rel}:{line} {what}'
             for rel, tree in _sources(exclude=('tests', 'util_scripts', 'bench'))
             if str(rel) != 'opts.py' for line, what in _option_writes(tree)]
    assert found == []


def test_the_library_does_not_import_scripts():
    found = []
    for rel, tree in _sources(exclude=('tests', 'util_scripts', 'bench')):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f'{rel}:{node.lineno} {n}' for n in names if n.split('.')[0] == 'util_scripts']
    assert found == []


def test_functions_are_short():
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and (str(rel), node.name) != ('opts.py', 'build_parser'):
                    found.append(f'{rel}:{node.name} {n} lines')
    assert found == []


def test_the_checks_find_what_they_look_for():
    tree = ast.parse('opt.lr = 1\nopts.x += 2\nsetattr(args, "y", 3)\nother.z = 4\n')
    assert [what for _, what in _option_writes(tree)] == ['opt.lr', 'opts.x', 'setattr']
