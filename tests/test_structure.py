"""The project's structure rules, checked on the source: parsed options are read,
never written, outside opts.py; the library never imports util_scripts nor the
command-line module opts.py; no import cycle among the project's modules
(imports inside functions count); every user-facing error type lives in
utils/errors.py; evaluation never imports the training loop; no function is
longer than 60 lines (the option table excepted); main.py is at most 350 lines;
no import climbs a floor (utils/ and models/ are the ground, datasets/ above
them, the top-level modules above those, the entry points on top)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTION_NAMES = {'opt', 'opts', 'args'}
MAX_FUNCTION_LINES = 60
# main.py reads as the stages of a run; the checkpoint format (checkpoint.py),
# the processes (utils/launch.py) and the logs (utils/logs.py) live elsewhere.
MAX_MAIN_LINES = 350
# The command lines: they may import opts.py; everything else is the library.
ENTRY_POINTS = {'main', 'predict'}
ENTRY_PACKAGES = ('util_scripts', 'bench', 'tests')
# Exception classes outside utils/errors.py that are not user-facing errors:
# a stop request that unwinds the run, and the models' depth check, which
# model.py turns into an OptionError naming the option. (bench/ has its own.)
NOT_USER_ERRORS = {('utils/preemption.py', 'Preempted'), ('models/resnet.py', 'DepthError'),
                   ('util_scripts/stream_file.py', 'Stopped'),  # a signal, as control flow
                   # a GPU self-check's result, printed as its SKIP or FAIL line
                   ('util_scripts/gpu_checks/common.py', 'Skip'),
                   ('util_scripts/gpu_checks/common.py', 'Failed')}


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


def _imports(tree):
    """(line, module) of every import in a file, at the top or inside functions."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)


def test_evaluation_does_not_import_the_training_loop():
    """Validation, inference and predict take their device and precision
    helpers from datasets/device_batches.py and utils/precision.py."""
    evaluation = {'validation.py', 'inference.py', 'predict.py', 'datasets/device_batches.py',
                  'utils/precision.py'}
    found = [f'{rel}:{line} {module}' for rel, tree in _sources() if rel.as_posix() in evaluation
             for line, module in _imports(tree) if module.split('.')[0] == 'training']
    assert found == []
    assert {rel.as_posix() for rel, _ in _sources()} >= evaluation  # the files are where we look


def test_functions_are_short():
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and (str(rel), node.name) != ('opts.py', 'build_parser'):
                    found.append(f'{rel}:{node.name} {n} lines')
    assert found == []


def test_main_is_its_stages():
    lines = (ROOT / 'main.py').read_text().count('\n')
    assert lines <= MAX_MAIN_LINES, f'main.py has {lines} lines'


def test_the_checks_find_what_they_look_for():
    tree = ast.parse('opt.lr = 1\nopts.x += 2\nsetattr(args, "y", 3)\nother.z = 4\n')
    assert [what for _, what in _option_writes(tree)] == ['opt.lr', 'opts.x', 'setattr']


# ----------------------------------------------------------------------------- imports

def _module_name(rel):
    parts = list(Path(rel).with_suffix('').parts)
    if parts[-1] == '__init__':
        parts.pop()
    return '.'.join(parts)


def project_modules(root=ROOT):
    """{module name: source} of every .py file of the project, tests included."""
    return {_module_name(rel): (root / rel).read_text()
            for rel, _ in ((p.relative_to(root), None) for p in sorted(root.rglob('*.py')))
            if not any(part.startswith('.') or part in ('venv', 'data', 'results')
                       for part in rel.parts)}


def _imported(node, module, is_package, known):
    """The project modules an import statement in `module` loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    base = node.module or ''
    if node.level:  # relative: from the package of `module`
        package = module.split('.') if is_package else module.split('.')[:-1]
        package = package[:len(package) - node.level + 1]
        base = '.'.join(package + ([node.module] if node.module else []))
    found = [base] if base in known else []
    return found + [f'{base}.{a.name}' for a in node.names if f'{base}.{a.name}' in known]


def import_graph(modules, packages=()):
    """{module: set of the project modules it imports}, from every import
    statement of its source, at any depth (function-level ones too)."""
    graph = {}
    for name, source in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_imported(node, name, name in packages, modules))
        graph[name] = edges - {name}
    return graph


def import_cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _is_library(module):
    return module not in ENTRY_POINTS and module.split('.')[0] not in ENTRY_PACKAGES


def opts_importers(graph):
    return sorted(m for m, edges in graph.items() if 'opts' in edges and _is_library(m))


def _project_graph():
    modules = project_modules()
    packages = {m for m in modules if (ROOT / m.replace('.', '/') / '__init__.py').exists()}
    return import_graph(modules, packages)


# The floors a module may import from: its own and those below.
GROUND, DATA, LIBRARY, ENTRY, TOOLS = range(5)


def floor(module):
    head = module.split('.')[0]
    if head in ('utils', 'models'):
        return GROUND
    if head == 'datasets':
        return DATA
    if head in ENTRY_POINTS:
        return ENTRY
    return TOOLS if head in ENTRY_PACKAGES else LIBRARY


def climbing_imports(graph):
    return sorted(f'{m} imports {n}' for m, edges in graph.items() for n in edges
                  if floor(n) > floor(m) and floor(m) < TOOLS)


def test_no_import_climbs_a_floor():
    assert climbing_imports(_project_graph()) == []


def test_no_import_cycle():
    assert [sorted(c) for c in import_cycles(_project_graph())] == []


def test_the_library_does_not_import_opts():
    assert opts_importers(_project_graph()) == []


def test_user_errors_live_in_one_module():
    found = []
    for rel, tree in _sources(exclude=('tests', 'bench')):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and str(rel) != 'utils/errors.py' and \
                    (str(rel), node.name) not in NOT_USER_ERRORS and \
                    any(isinstance(b, ast.Name) and (b.id.endswith(('Error', 'Exception')))
                        for b in node.bases):
                found.append(f'{rel}:{node.lineno} {node.name}')
    assert found == []


def test_the_import_checks_find_what_they_look_for():
    planted = {
        'a': 'import b\n',
        'b': 'def f():\n    from c import x\n',  # a function-level import counts
        'c': 'from a import y\nimport opts\n',
        'd': 'import a\n',
        'opts': '',
        'main': 'import opts\n',  # an entry point may
        'pkg': '',
        'pkg.m': 'from . import n\n',
        'pkg.n': 'from .m import z\n',
    }
    graph = import_graph(planted, packages={'pkg'})
    assert graph['pkg.m'] == {'pkg', 'pkg.n'} and graph['pkg.n'] == {'pkg.m'}
    assert sorted(sorted(c) for c in import_cycles(graph)) == [['a', 'b', 'c'], ['pkg.m', 'pkg.n']]
    assert opts_importers(graph) == ['c']
    floors = import_graph({'utils.u': 'import datasets.d\n', 'models.m': 'from utils import u\n',
                           'datasets': '', 'datasets.d': 'def f():\n    import inference\n',
                           'inference': 'import predict\n', 'predict': 'import inference\n',
                           'utils': '', 'tests.t': 'import predict\n'}, packages={'datasets', 'utils'})
    assert climbing_imports(floors) == ['datasets.d imports inference', 'inference imports predict',
                                        'utils.u imports datasets.d']
    assert import_cycles(import_graph({'a': 'import b\n', 'b': ''})) == []
