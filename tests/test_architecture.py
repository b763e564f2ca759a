"""The architecture of docs/architecture.md, checked against the code.

- Imports flow down the layers: every import statement of every .py/.pyx/.pxd/.pxi file under
  fastring/ and kernels/ (lazy imports inside functions and `if TYPE_CHECKING:` blocks included,
  relative imports resolved) names a module of the importer's own layer or of a layer below.
- fastring's modules import one another without cycles (lazy imports included; importing a
  package counts as an edge to its `__init__`, which re-exports submodules).
- What the doc claims holds: every dotted name it puts in backquotes exists, and its example
  algorithm (`Gather0`) runs `fastring.allreduce` after a change to the algorithm registry only.

Run as a script under mpiexec (`mpiexec -n 2 python tests/test_architecture.py gather0`), it
runs the doc's example algorithm on several ranks; `test_doc_example_algorithm_on_two_ranks`
does that.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
# Source folder of each package (pyproject.toml maps fastring.kernels to kernels/).
SOURCES = {"fastring": ROOT / "fastring", "fastring.kernels": ROOT / "kernels"}
# .pxi files are textually included by a .pyx; their imports are checked like a module's.
SUFFIXES = (".py", ".pyx", ".pxd", ".pxi")

# The layers, bottom (0) to top. A module may import from its own layer and the layers below,
# with two stricter rules: `kernels` imports nothing from fastring outside fastring.kernels but
# the one dtype table (fastring._core.dtypes), which it builds its element types from,
# and an adapter imports only the public facade `fastring`, `fastring._horovod` and its own
# package (e.g. fastring.torch.*).
RANK = {"_core": 0, "kernels": 0, "_transport": 1, "algorithms": 2, "engine": 3, "api": 4,
        "facade": 5, "_horovod": 6, "adapters": 7, "tools": 8}
ORDER = " < ".join(" = ".join(n for n in RANK if RANK[n] == r) for r in sorted(set(RANK.values())))
KERNELS_MAY_IMPORT = ("fastring._core", "fastring._core.dtypes")
ADAPTERS = ("torch", "tensorflow", "keras", "jax")  # fastring.<name>: framework adapters
# Adapters built on another adapter, which they may import too: Keras' TensorFlow backend
# reduces its symbolic gradients with fastring.tensorflow (as horovod.tensorflow.keras is
# built on horovod.tensorflow).
ADAPTER_BASES = {"fastring.keras": ("fastring.tensorflow",)}
# Upward imports the tree has today, each waiting for its fix; never add to this list.
# (importing module, layer it imports from) -> what is wrong.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


# ----------------------------------------------------------------- reading the imports
@dataclasses.dataclass(frozen=True)
class Import:
    path: str      # the importing file, relative to the repository root
    line: int
    text: str      # the statement as written
    importer: str  # the importing module
    target: str    # a module the statement loads
    via: str = ""  # for a package loaded before its submodule: that submodule

    def where(self) -> str:
        how = f" (which first runs package {self.target}'s __init__)" if self.via else ""
        return f"{self.path}:{self.line}: `{self.text}`{how}"


def module_files(sources: dict[str, Path]) -> list[tuple[str, Path, bool]]:
    """(module name, file, whether it is a package's __init__) of every source file."""
    found = []
    for package, folder in sources.items():
        for path in sorted(folder.rglob("*")):
            if path.suffix not in SUFFIXES or "__pycache__" in path.parts or not path.is_file():
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found.append((".".join([package, *parts]), path, is_package))
    return found


def absolute(name: str | None, level: int, module: str, is_package: bool) -> str:
    """The module that `from <level dots><name> import ...` names inside `module`."""
    if level == 0:
        return name or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 >= len(package):
        raise ImportError(f"relative import beyond the top-level package in {module}")
    base = ".".join(package[:len(package) - (level - 1)])
    return f"{base}.{name}" if name else base


def _dynamic_anchor(arg: ast.expr | None, module: str, is_package: bool) -> str | None:
    """What `__name__` / `__package__` stand for as importlib.import_module's package."""
    if isinstance(arg, ast.Name) and arg.id == "__name__":
        return module
    if isinstance(arg, ast.Name) and arg.id == "__package__":
        return module if is_package else module.rpartition(".")[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def python_statements(source: str, filename: str, module: str, is_package: bool):
    """(line, text, base module, imported names or None) of every import in Python source,
    anywhere in the tree (functions, TYPE_CHECKING blocks), and of importlib.import_module /
    __import__ calls with a literal name."""
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            text = " ".join((ast.get_source_segment(source, node) or "").split())
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, text, alias.name, None
            else:
                base = absolute(node.module, node.level, module, is_package)
                yield node.lineno, text, base, [a.name for a in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            name = node.args[0]
            if called not in ("import_module", "__import__") or not (
                    isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue
            text = " ".join((ast.get_source_segment(source, node) or "").split())
            target = name.value
            if called == "import_module" and target.startswith("."):
                package = node.args[1] if len(node.args) > 1 else None
                anchor = _dynamic_anchor(package, module, is_package)
                if anchor is None:
                    continue
                level = len(target) - len(target.lstrip("."))
                target = absolute(target.lstrip(".") or None, level, anchor, True)
            yield node.lineno, text, target, None


_TRIPLE_QUOTED = re.compile(r'("""|\'\'\')(?:.|\n)*?\1')
_CYTHON_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+(?P<base>\.*[\w.]*)[ \t]+c?import[ \t]+(?P<names>\([^)]*\)|[^\n]*)"
    r"|c?import[ \t]+(?P<modules>[^\n]*))", re.M)


def cython_statements(source: str, module: str, is_package: bool):
    """The same for Cython source: `import`, `cimport`, `from ... import`/`cimport` lines
    (docstrings and comments skipped, parenthesized name lists joined)."""
    source = _TRIPLE_QUOTED.sub(lambda m: "\n" * m.group(0).count("\n"), source)
    for m in _CYTHON_IMPORT.finditer(source):
        line = source.count("\n", 0, m.start()) + 1
        text = " ".join(re.sub(r"#[^\n]*", "", m.group(0)).split())
        if m.group("modules") is not None:
            for item in re.sub(r"#.*", "", m.group("modules")).split(","):
                if item.strip():
                    yield line, text, item.split()[0], None
            continue
        names = re.sub(r"#[^\n]*", "", m.group("names")).strip("() \t\n")
        dotted = m.group("base")
        level = len(dotted) - len(dotted.lstrip("."))
        base = absolute(dotted.lstrip(".") or None, level, module, is_package)
        yield line, text, base, [n.split()[0] for n in names.split(",") if n.strip()]


def imports_of(source: str, path: Path, rel: str, module: str, is_package: bool,
               modules: set[str]) -> list[Import]:
    """Every fastring module one file's statements load: for `from X import a`, X.a when that
    is a module, else X; and the packages above it that are not the importer's own (importing
    fastring.engine.request runs fastring/engine/__init__.py first)."""
    if path.suffix == ".py":
        statements = python_statements(source, str(path), module, is_package)
    else:
        statements = cython_statements(source, module, is_package)
    own = {".".join(module.split(".")[:k]) for k in range(1, module.count(".") + 2)}
    found: list[Import] = []
    for line, text, base, names in statements:
        if base != "fastring" and not base.startswith("fastring."):
            continue
        targets = [base] if not names else [
            f"{base}.{n}" if f"{base}.{n}" in modules else base for n in names]
        for target in dict.fromkeys(targets):
            found.append(Import(rel, line, text, module, target))
            parts = target.split(".")
            for k in range(2, len(parts)):
                parent = ".".join(parts[:k])
                if parent not in own:
                    found.append(Import(rel, line, text, module, parent, via=target))
    return found


def all_imports(sources: dict[str, Path] = SOURCES, root: Path = ROOT) -> tuple[set[str], list[Import]]:
    files = module_files(sources)
    modules = {m for m, _, _ in files}
    found: list[Import] = []
    for module, path, is_package in files:
        rel = str(path.relative_to(root))
        found += imports_of(path.read_text(), path, rel, module, is_package, modules)
    return modules, found


# ----------------------------------------------------------------- the rules
def layer_of(module: str) -> str | None:
    if module == "fastring":
        return "facade"
    top = module.split(".")[1]
    if top in ADAPTERS:
        return "adapters"
    return top if top in RANK and top not in ("facade", "adapters") else None


def violation(imp: Import) -> str | None:
    """Why `imp` breaks a layering rule, or None."""
    source, target = layer_of(imp.importer), layer_of(imp.target)
    if source is None or target is None:
        return None  # test_every_module_is_in_a_layer reports these
    if imp.importer == imp.target:
        return None
    if source == "kernels" and target != "kernels" and imp.target not in KERNELS_MAY_IMPORT:
        return (f"kernels imports nothing from fastring outside fastring.kernels but "
                f"{', '.join(KERNELS_MAY_IMPORT)}, and loads {imp.target}")
    if source == "adapters":
        own = ".".join(imp.importer.split(".")[:2])
        allowed = (own, *ADAPTER_BASES.get(own, ()))
        if not (imp.target in ("fastring", *allowed)
                or imp.target.startswith((*(a + "." for a in allowed), "fastring._horovod"))):
            return (f"an adapter imports only the public facade `fastring`, `fastring._horovod` and "
                    f"its own package {own}, but {imp.importer} loads {imp.target}")
        return None
    if RANK[target] > RANK[source]:
        return (f"{imp.importer} (layer {source}) loads {imp.target} from the layer above it, {target} "
                f"(bottom to top: {ORDER})")
    return None


def layer_violations(imports: list[Import]) -> tuple[list[str], set]:
    """(an error line per upward import not in KNOWN_UPWARD, the KNOWN_UPWARD keys seen)."""
    errors, known = [], set()
    for imp in imports:
        if imp.via:
            continue  # a package above the target: the target's own layer, reported once
        why = violation(imp)
        if why is None:
            continue
        key = (imp.importer, layer_of(imp.target))
        if key in KNOWN_UPWARD:
            known.add(key)
        else:
            errors.append(f"{imp.where()}: {why}")
    return errors, known


def cycles(imports: list[Import]) -> list[list[Import]]:
    """One cycle (as the imports along it) per strongly connected group of modules."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.importer != imp.target:
            graph.setdefault(imp.importer, {}).setdefault(imp.target, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for group in groups:  # a shortest way from the group's first module back to itself
        start = min(group)
        paths = {start: []}
        frontier = [start]
        cycle = None
        while frontier and cycle is None:
            nxt = []
            for v in frontier:
                for w, imp in sorted(graph.get(v, {}).items()):
                    if w == start:
                        cycle = paths[v] + [imp]
                        break
                    if w in group and w not in paths:
                        paths[w] = paths[v] + [imp]
                        nxt.append(w)
                if cycle is not None:
                    break
            frontier = nxt
        found.append(cycle)
    return found


def describe_cycle(cycle: list[Import]) -> str:
    chain = " -> ".join([cycle[0].importer] + [imp.target for imp in cycle])
    return chain + "".join(f"\n    {imp.where()}" for imp in cycle)


# ----------------------------------------------------------------- the tree's tests
def test_every_module_is_in_a_layer():
    modules, _ = all_imports()
    assert modules, "no source files found"
    homeless = sorted(m for m in modules if layer_of(m) is None)
    assert not homeless, (f"modules in no layer: {homeless}; give their package a place in RANK or "
                          "ADAPTERS here and in docs/architecture.md")


def test_imports_flow_down_the_layers():
    _, imports = all_imports()
    errors, known = layer_violations(imports)
    stale = sorted(set(KNOWN_UPWARD) - known)
    assert not errors, "imports from a layer above:\n" + "\n".join(errors)
    assert not stale, f"fixed, so remove them from KNOWN_UPWARD in tests/test_architecture.py: {stale}"


def test_no_import_cycles():
    _, imports = all_imports()
    found = cycles(imports)
    assert not found, "import cycles among fastring's modules:\n" + "\n".join(map(describe_cycle, found))


# ----------------------------------------------------------------- the checker's own tests
def _tree(tmp_path: Path, files: dict[str, str]) -> tuple[dict[str, Path], list[Import]]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    sources = {"fastring": tmp_path / "fastring", "fastring.kernels": tmp_path / "kernels"}
    (tmp_path / "kernels").mkdir(exist_ok=True)
    return sources, all_imports(sources, tmp_path)[1]


def test_checker_finds_upward_imports_of_every_form(tmp_path):
    _, imports = _tree(tmp_path, {
        "fastring/__init__.py": "from .api import run\n",
        "fastring/_core/__init__.py": "",
        "fastring/_core/ops.py": "def f():\n    from ..engine import Engine  # lazy\n",
        "fastring/algorithms/__init__.py": "",
        "fastring/algorithms/ring.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from fastring.api.process import init\n"),
        "fastring/_transport/__init__.py": "",
        "fastring/_transport/tags.pxd": "cdef enum Tag:\n    RING = 1\n",
        "fastring/_transport/ring.pyx": ('"""from ..api import nothing (a docstring)"""\n'
                                         "from libc.stdint cimport int64_t\n"
                                         "from . cimport tags\nfrom ..engine.queue cimport (Queue,  # c\n"
                                         "    Item)\n"),
        "fastring/engine/__init__.py": "", "fastring/engine/queue.pxd": "",
        "fastring/api/__init__.py": "", "fastring/api/process.py": "",
        "fastring/torch/__init__.py": ("import fastring\nfrom fastring import allreduce\nfrom . import ops\n"
                                       "from fastring._core import pool\n"),
        "fastring/torch/ops.py": "from fastring._horovod import args\nfrom .. import torch\n",
        "fastring/_horovod.py": "",
        "kernels/cpu.py": "import importlib\nfrom .ops import X\nfrom .._core.pool import empty\n",
        "kernels/ops.py": "",
    })
    errors, _ = layer_violations(imports)
    text = "\n".join(errors)
    assert len(errors) == 5, text
    assert "fastring/_core/ops.py:2: `from ..engine import Engine`" in text
    assert "fastring/algorithms/ring.py:3: `from fastring.api.process import init`" in text
    assert "fastring/_transport/ring.pyx:4: `from ..engine.queue cimport (Queue, Item)`" in text
    assert "fastring/torch/__init__.py:4: `from fastring._core import pool`: an adapter" in text
    assert "kernels/cpu.py:3: `from .._core.pool import empty`: kernels imports nothing" in text


def test_checker_finds_cycles_through_lazy_imports_and_package_reexports(tmp_path):
    _, imports = _tree(tmp_path, {
        "fastring/_core/__init__.py": "",
        "fastring/_core/ops.py": "from .work import nothing\n",
        "fastring/_core/work.py": "def f():\n    from . import ops\n",
        "fastring/engine/__init__.py": "from .engine import Engine\n",
        "fastring/engine/engine.py": "from .fusion import Executor\n",
        "fastring/engine/fusion.py": "from ..engine import Engine  # the package, not the module\n",
        "fastring/api/__init__.py": "", "fastring/api/a.py": "from . import b\n",
        "fastring/api/b.py": "import importlib\nimportlib.import_module('.a', __package__)\n",
        "fastring/tools/__init__.py": "", "fastring/tools/x.py": "from fastring.engine.engine import Engine\n",
    })
    found = sorted((describe_cycle(c) for c in cycles(imports)))
    assert len(found) == 3, found
    assert found[0].startswith("fastring._core.ops -> fastring._core.work -> fastring._core.ops")
    assert "fastring/_core/work.py:2: `from . import ops`" in found[0]
    assert found[1].startswith("fastring.api.a -> fastring.api.b -> fastring.api.a")
    assert "fastring/api/b.py:2: `importlib.import_module('.a', __package__)`" in found[1]
    assert found[2].startswith("fastring.engine -> fastring.engine.engine -> fastring.engine.fusion "
                               "-> fastring.engine")
    # tools reaches fastring.engine.engine through the package's __init__: an edge, no cycle
    assert any(i.importer == "fastring.tools.x" and i.target == "fastring.engine" and i.via for i in imports)


# ----------------------------------------------------------------- the doc's names
def _doc_text() -> str:
    return DOC.read_text()


def _inline_code(markdown: str) -> list[str]:
    """The inline code spans of the markdown outside fenced blocks."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", prose)


# Named by docs/architecture.md but not in the tree: the adapters' shared Horovod layer (coming)
# and the file of the doc's example algorithm.
PLANNED = ("fastring/algorithms/gather0.py",)
THIRD_PARTY = {"np": "numpy", "numpy": "numpy", "torch": "torch", "mpi4py": "mpi4py", "numba": "numba"}
_DOTTED = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?")


def _fastring_modules() -> dict[str, object]:
    loaded = {}
    for module, _, _ in module_files(SOURCES):
        try:
            loaded[module] = importlib.import_module(module)
        except ImportError:  # an optional framework that is not installed
            pass
    return loaded


def _resolves(name: str, modules: dict[str, object]) -> bool:
    def walk(obj, attrs) -> bool:
        for attr in attrs:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True

    parts = name.split(".")
    if parts[0] in THIRD_PARTY:
        return walk(importlib.import_module(THIRD_PARTY[parts[0]]), parts[1:])
    for full in (parts, ["fastring", *parts]):
        for k in range(len(full), 0, -1):
            module = modules.get(".".join(full[:k]))
            if module is not None and walk(module, full[k:]):
                return True
    # `Class.method`, `module.function`: the first part is a name some fastring module defines
    for mod_name, module in modules.items():
        if mod_name.rpartition(".")[2] == parts[0] and walk(module, parts[1:]):
            return True
        if parts[0] in vars(module) and walk(vars(module)[parts[0]], parts[1:]):
            return True
    return False


def test_every_name_the_doc_gives_exists():
    text = _doc_text()
    modules = _fastring_modules()
    names = {m.group(1) for span in _inline_code(text) if (m := _DOTTED.fullmatch(span.strip()))
             and not m.group(1).endswith((".py", ".pyx", ".pxd", ".md", ".toml", ".json"))
             and not m.group(1).startswith(PLANNED)}
    paths = {span for span in _inline_code(text)
             if re.fullmatch(r"[\w./-]+/[\w.-]*|[\w-]+\.(md|toml|py)", span)}
    assert len(names) > 40, sorted(names)
    missing = sorted(n for n in names if not _resolves(n, modules))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
    absent = sorted(p for p in paths if not (ROOT / p).exists() and p not in PLANNED)
    assert not absent, f"docs/architecture.md names files that do not exist: {absent}"


# ----------------------------------------------------------------- the doc's example algorithm
def doc_example() -> tuple[type, str]:
    """The doc's example algorithm, `Gather0`, run as the module docs/architecture.md says it
    is (fastring/algorithms/gather0.py); with its source."""
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)
    source = next(b for b in blocks if "class Gather0" in b)
    namespace = {"__name__": "fastring.algorithms.gather0", "__package__": "fastring.algorithms"}
    exec(compile(source, "docs/architecture.md (fastring/algorithms/gather0.py)", "exec"), namespace)
    return namespace["Gather0"], source


def register(algorithm: type, setattr_=setattr) -> None:
    """What listing `algorithm` in registry.REGISTRY["allreduce"] does: the registry derives
    its table of names (_BY_NAME) and SELECTABLE from REGISTRY when it is imported."""
    from fastring.algorithms import registry

    table = dict(registry.REGISTRY, allreduce=(*registry.REGISTRY["allreduce"], algorithm))
    by_name = {a.name: a for algorithms in table.values() for a in algorithms
               if getattr(a, "selectable", False)}
    setattr_(registry, "REGISTRY", table)
    setattr_(registry, "_BY_NAME", by_name)
    setattr_(registry, "SELECTABLE", ("auto", *by_name))


def test_doc_example_algorithm_imports_only_from_below():
    _, source = doc_example()
    imports = imports_of(source, Path("gather0.py"), "docs/architecture.md", "fastring.algorithms.gather0",
                         False, {m for m, _, _ in module_files(SOURCES)})
    errors, _ = layer_violations(imports)
    assert imports and not errors, errors


def test_a_new_algorithm_needs_only_the_registry(monkeypatch):
    import numpy as np

    import fastring
    from fastring._core.dtypes import spec_of
    from fastring.algorithms import Ring, registry

    Gather0, _ = doc_example()
    ran = []
    run = Gather0.run
    monkeypatch.setattr(Gather0, "run",
                        staticmethod(lambda rt, r: (ran.append(r.flat.nbytes), run(rt, r))[1]))
    register(Gather0, monkeypatch.setattr)
    was_initialized = fastring.is_initialized()
    fastring.shutdown()
    monkeypatch.setenv("FASTRING_ALGORITHM", "gather0")
    try:
        fastring.init()  # init checks the setting against the registry's names
        spec = spec_of("float32")
        assert registry.choose("allreduce", 1 << 20, spec) is Ring  # auto never takes it
        assert registry.choose("allreduce", 1 << 20, spec, setting="gather0") is Gather0
        x = np.arange(1 << 16, dtype=np.float32)  # 256 KiB: too large to travel in the cycle
        # the lean path (Engine.lone_allreduce), a new result and in place
        np.testing.assert_array_equal(fastring.allreduce(x, op=fastring.Sum), np.arange(1 << 16))
        y = x.copy()
        assert fastring.allreduce(y, op=fastring.Sum, out=y) is y
        # the general path (Executor._reduce_batch), with a prescale and a finalizer (postscale)
        h = fastring.allreduce_async(x, name="gather0.w", prescale_factor=2.0, postscale_factor=3.0)
        np.testing.assert_array_equal(h.wait(), 6 * np.arange(1 << 16))
        assert ran == [x.nbytes] * 3
    finally:
        fastring.shutdown()
        monkeypatch.undo()
        if was_initialized:
            fastring.init()


def test_doc_example_algorithm_on_two_ranks():
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, __file__, "gather0"], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, FASTRING_ALGORITHM="gather0"))
    assert proc.returncode == 0 and proc.stdout.count("gather0 ok") == 2, proc.stdout + proc.stderr


def _gather0_worker() -> None:
    import numpy as np

    import fastring

    Gather0, _ = doc_example()
    register(Gather0)
    fastring.init()
    rank, size = fastring.rank(), fastring.size()
    base = np.arange(1 << 16, dtype=np.float32)
    expected = sum(base + r for r in range(size))
    np.testing.assert_array_equal(fastring.allreduce(base + rank, op=fastring.Sum), expected)
    got = fastring.allreduce_async(base + rank, name="w").wait()  # Average
    np.testing.assert_array_equal(got, expected / size)
    ints = np.full(100_000, rank + 1, np.int64)
    np.testing.assert_array_equal(fastring.allreduce(ints, op=fastring.Max), np.full(100_000, size))
    print(f"rank {rank}: gather0 ok", flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["gather0"]:
    _gather0_worker()
