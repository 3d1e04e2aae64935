"""Structural rules of the code base (CONTRIBUTING.md "Architecture"), checked on the source tree with `ast`.

- no module reaches into another module's private names (`obj._name` on anything but self/cls, or
  `from x import _name`), except dunders and the subclass contract a Flow or Kernel subclass implements;
- only the training loop's stepper (`training/stepper.py`) calls `.backward()` (everything else uses `torch.autograd.grad`);
- no import cycle inside flowgp; nothing calls `torch.set_default_dtype`, `torch.manual_seed`,
  `np.random.seed` or `matplotlib.use`;
- the packages depend one way, in the order of `LAYERS` (a module imports only from its own layer or below);
- at most six modules at the package root; no function in `src/` longer than 100 lines;
- no tracked file under `docs/` is over 1 MB (results are rows, reports and figures, not training state), and the
  state of runs in progress under `runs/` stays within 30 MB in all;
- no test imports a benchmark script, directly or through sys.path / a file path into `benchmarks/`; the scripts
  import no test, no other script (shared code lives in `benchmarks/lib/`), never touch sys.path and use only
  flowgp's public names;
- tests and benchmark scripts speak of the software, not of sessions, issue numbers or tickets;
- the tests mirror the packages: every module `src/flowgp/<package>/<module>.py` has its test file
  `tests/<package>/test_<module>.py` (a root module: `tests/test_<module>.py`), except the few in
  `MODULES_WITHOUT_OWN_TESTS`, each with its reason; every test folder is named after a package.

Run `python tests/test_architecture.py` for the full list of violations.
"""
from __future__ import annotations

import ast
import os
import subprocess
import re
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "flowgp"
TESTS = SRC.parents[1] / "tests"
BENCHMARKS = SRC.parents[1] / "benchmarks"

#: receivers whose private attributes a module may touch: itself and its class
_OWN = {"self", "cls"}
#: torch internals a module may read, with the reason: the engine's "will this node run" query has no public
#: equivalent (pytorch/pytorch#174017); needed_gradients.py looks it up once, with a fallback when it is absent
_TORCH_PRIVATE_ALLOWED = {("needed_gradients.py", "torch._C")}
#: the one module that calls .backward()
_BACKWARD_HOME = Path("training") / "stepper.py"

#: the layers, lowest first: a module may import from its own layer and the layers below it, never above.
#: Keys are top-level packages or root modules of flowgp.
LAYERS = (
    ("numerics", "data", "reporting", "registry", "compat"),
    ("flows",),
    ("gp",),
    ("models",),
    ("build", "training"),
    ("estimators",),
    ("bench", "cli", "__main__", ""),
)
ROOT_MODULE_LIMIT = 6
FUNCTION_LINE_LIMIT = 100


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_names(tree: ast.AST) -> set[str]:
    """Names defined at any level in the module (its own private helpers and attributes)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def private_access_violations() -> list[str]:
    out = []
    for path, tree in _modules():
        own = _defined_names(tree)
        rel = path.relative_to(SRC.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None or isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if _is_private(alias.name):
                        out.append(f"{rel}:{node.lineno} imports private {alias.name} from {node.module}")
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                value = node.value
                if isinstance(value, ast.Name) and value.id in _OWN:
                    continue
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                    continue
                if node.attr in own:
                    continue  # a private name this module defines itself (its own class's attribute)
                if (path.name, ast.unparse(node)) in _TORCH_PRIVATE_ALLOWED:
                    continue
                out.append(f"{rel}:{node.lineno} uses private {ast.unparse(node)}")
    return out


def backward_violations() -> list[str]:
    out = []
    for path, tree in _modules():
        if path.relative_to(SRC) == _BACKWARD_HOME:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
                out.append(f"{path.relative_to(SRC.parent)}:{node.lineno} calls .backward()")
    return out


_GLOBAL_STATE = {("torch", "set_default_dtype"), ("torch", "manual_seed"), ("random", "seed"),
                 ("matplotlib", "use"), ("cuda", "manual_seed"), ("cuda", "manual_seed_all")}


def global_state_violations() -> list[str]:
    out = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
                if (owner_name, node.func.attr) in _GLOBAL_STATE:
                    out.append(f"{path.relative_to(SRC.parent)}:{node.lineno} calls {ast.unparse(node.func)}")
    return out


def _imports(path: Path, tree: ast.AST) -> set[str]:
    """flowgp modules imported by this module (module-level and inside functions)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("flowgp"):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if (SRC.parent / (sub.replace(".", "/") + ".py")).exists()
                              or (SRC.parent / sub.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("flowgp"):
                    found.add(alias.name)
    found.discard(name)
    return found


def import_cycles() -> list[str]:
    """Cycles among flowgp modules, package __init__ files left out (they only re-export)."""
    graph = {}
    for path, tree in _modules():
        if path.name == "__init__.py":
            continue
        graph[_module_name(path)] = {m for m in _imports(path, tree)}
    graph = {k: {m for m in v if m in graph} for k, v in graph.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_no_module_uses_another_modules_private_names():
    assert private_access_violations() == []


def test_only_training_calls_backward():
    assert backward_violations() == []


def test_no_global_state_is_changed():
    assert global_state_violations() == []


def test_no_import_cycles():
    assert import_cycles() == []


def _layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for level, members in enumerate(LAYERS):
        if top in members:
            return level
    raise AssertionError(f"{module}: its package {top!r} has no place in LAYERS; add it there")


def layer_violations() -> list[str]:
    out = []
    for path, tree in _modules():
        name = _module_name(path)
        for target in sorted(_imports(path, tree)):
            if _layer_of(target) > _layer_of(name):
                out.append(f"{path.relative_to(SRC.parent)} imports {target}, a higher layer")
    return out


def long_functions(limit: int = FUNCTION_LINE_LIMIT) -> list[str]:
    out = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    out.append(f"{path.relative_to(SRC.parent)}:{node.lineno} {node.name} has {length} lines")
    return out


def test_packages_depend_one_way():
    assert layer_violations() == []


def test_package_root_holds_few_modules():
    root = sorted(p.name for p in SRC.glob("*.py"))
    assert len(root) <= ROOT_MODULE_LIMIT, root


REPO = SRC.parents[1]
#: the largest file `docs/` may track, and what the transient state of runs in progress (`runs/`) may hold in all
DOCS_FILE_LIMIT = 1_000_000
RUNS_TOTAL_LIMIT = 30_000_000


def tracked_files(folder: str) -> list[Path] | None:
    """The files git tracks under `folder` of the repository that exist on disk, or None outside a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=REPO, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = [REPO / name for name in listed.stdout.decode().split("\0") if name]
    return [p for p in paths if p.is_file()]


def oversized_docs_files(limit: int = DOCS_FILE_LIMIT) -> list[str]:
    return [f"{p.relative_to(REPO)}: {os.path.getsize(p) / 1e6:.1f} MB" for p in tracked_files("docs") or []
            if os.path.getsize(p) > limit]


def runs_over_budget(limit: int = RUNS_TOTAL_LIMIT) -> list[str]:
    total = sum(os.path.getsize(p) for p in tracked_files("runs") or [])
    return [f"runs/ holds {total / 1e6:.1f} MB, over its {limit / 1e6:.0f} MB"] if total > limit else []


def _in_git_checkout():
    if tracked_files("tests") is None:
        pytest.skip("not a git checkout")


def test_no_tracked_file_under_docs_is_over_1_mb():
    """docs/ holds rows, reports and figures; training state of runs in progress belongs in runs/ (runs/README.md)."""
    _in_git_checkout()
    assert oversized_docs_files() == []


def test_runs_in_progress_stay_within_their_budget():
    _in_git_checkout()
    assert runs_over_budget() == []


def test_the_size_checks_see_the_files_git_tracks():
    """The two checks above read `git ls-files`: a tracked file over the limit is reported, with its size."""
    _in_git_checkout()
    readme = REPO / "runs" / "README.md"
    assert readme in tracked_files("runs")
    assert oversized_docs_files(limit=0) != [] and runs_over_budget(limit=0) != []
    assert any(line.startswith("runs/ holds") for line in runs_over_budget(limit=0))
# ----- tests and benchmark scripts --------------------------------------------------------------------------
#: calls that load code by path or change where imports look
_LOADERS = ("sys.path", "syspath_prepend", "spec_from_file_location", "run_path", "import_module", "__import__")


def _names_benchmarks(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "benchmarks" in n.value
               for n in ast.walk(node))


def _is_path_into_benchmarks(node: ast.AST) -> bool:
    """`root / "benchmarks"`, `Path(..., "benchmarks")`, `os.path.join(..., "benchmarks")`, `x.joinpath(...)`."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return any(isinstance(side, ast.Constant) and isinstance(side.value, str) and "benchmarks" in side.value
                   for side in (node.left, node.right))
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        if func in ("Path", "pathlib.Path", "os.path.join") or func.endswith(".joinpath"):
            return any(isinstance(a, ast.Constant) and isinstance(a.value, str) and "benchmarks" in a.value
                       for a in node.args)
    return False


def benchmark_imports_in_tests() -> list[str]:
    """Every place a test imports a benchmark script or builds a path into `benchmarks/` to load one."""
    out = []
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text()
        if path == Path(__file__).resolve() or "benchmarks" not in text:
            continue  # this file reads the scripts to check them; a file that never names them cannot load them
        tree = ast.parse(text, filename=str(path))
        rel = path.relative_to(TESTS.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "benchmarks" for a in node.names):
                out.append(f"{rel}:{node.lineno} imports {', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.ImportFrom) and not node.level \
                    and (node.module or "").split(".")[0] == "benchmarks":
                out.append(f"{rel}:{node.lineno} imports from {node.module}")
            elif isinstance(node, ast.Call) and any(k in ast.unparse(node.func) for k in _LOADERS) \
                    and _names_benchmarks(node):
                out.append(f"{rel}:{node.lineno} loads {ast.unparse(node)[:80]}")
            elif _is_path_into_benchmarks(node):
                out.append(f"{rel}:{node.lineno} builds a path into benchmarks/: {ast.unparse(node)[:80]}")
    return out


def _imports_a_test_or_script(name: str, scripts: set[str]) -> bool:
    """Whether a benchmark script's import of module `name` reaches a test or another script (not benchmarks.lib)."""
    top = name.split(".")[0]
    if top in ("tests", "conftest") or top.startswith("test_"):
        return True
    if top == "benchmarks":
        return name.split(".")[:2] != ["benchmarks", "lib"]
    return top in scripts


def script_violations() -> list[str]:
    """Benchmark scripts that import a test or another script (not `benchmarks.lib`), touch sys.path, or use a
    private name of flowgp (`from flowgp.x import _y`, `obj._y` on anything but self/cls/super, torch or the
    script's own names)."""
    scripts = {p.stem for p in BENCHMARKS.rglob("*.py")}
    out = []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        rel, own = path.relative_to(BENCHMARKS.parent), _defined_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    top = name.split(".")[0]
                    if _imports_a_test_or_script(name, scripts) or getattr(node, "level", 0):
                        out.append(f"{rel}:{node.lineno} imports {name or '.'}: a test or another script")
                if isinstance(node, ast.ImportFrom) and top == "flowgp":
                    out += [f"{rel}:{node.lineno} imports private {a.name} from {name}" for a in node.names
                            if _is_private(a.name)]
            elif isinstance(node, ast.Call) and "sys.path" in ast.unparse(node.func):
                out.append(f"{rel}:{node.lineno} changes sys.path")
            elif isinstance(node, ast.Attribute) and _is_private(node.attr) and node.attr not in own:
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in _OWN | {"torch"}:
                    continue
                if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "super":
                    continue
                out.append(f"{rel}:{node.lineno} uses private {ast.unparse(node)}")
    return out


def test_no_test_imports_a_benchmark_script():
    assert benchmark_imports_in_tests() == []


def test_benchmark_scripts_use_flowgp_and_their_lib_only():
    assert script_violations() == []


#: how the project once narrated its own making; the code and tests speak of the software (dates where history matters)
_NARRATION = re.compile(r"\bsessions?\b|\bissues? \d|\btickets?\b", re.IGNORECASE)


#: everything tracked that speaks to users or developers, CHANGELOG.md aside (its entries are dated history)
NARRATION_ROOTS = (TESTS, BENCHMARKS, SRC, SRC.parents[1] / "docs", SRC.parents[1] / "runs")
NARRATION_FILES = ("README.md", "CONTRIBUTING.md")


def narration_violations(roots=NARRATION_ROOTS) -> list[str]:
    """Lines of the code, tests, benchmark scripts, README and docs that speak of sessions, issue numbers or
    tickets (pytest's `scope="session"` and "an interactive session" aside)."""
    out = []
    repo = SRC.parents[1]
    for root in roots:
        candidates = [p for p in root.rglob("*") if p.suffix in (".py", ".sh", ".md", ".rst")
                      and not {"_build", "auto_examples", "generated"} & set(p.parts)]
        if root == roots[0]:
            candidates += [repo / name for name in NARRATION_FILES]
        for path in sorted(candidates):
            if path == Path(__file__).resolve():
                continue  # this file names the words it looks for
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if _NARRATION.search(line.replace('scope="session"', "").replace("interactive session", "")):
                    out.append(f"{path.relative_to(repo)}:{number}: {line.strip()[:80]}")
    return out


def test_the_project_speaks_of_the_software():
    assert narration_violations() == []


def test_no_function_in_src_is_over_100_lines():
    assert long_functions() == []


# ----- tests mirror the packages -----------------------------------------------------------------------------
#: modules without their own test file, each with the reason (where its behaviour is tested instead)
MODULES_WITHOUT_OWN_TESTS = {
    "models/_checks.py": "private argument checks; each model's clear-error tests exercise them "
                         "(tests/models/test_svgp.py, test_tgp.py)",
    "estimators/latent.py": "no test yet of its own; LatentDeepGPRegressor is fitted in "
                            "tests/models/latent/test_model.py and test_per_slot_objective.py",
    "bench/applications.py": "no test yet",
    "bench/cli.py": "no test yet of its own; the bench subcommands run through it in tests/bench/test_smoke.py "
                    "and test_*_tables.py",
    "bench/models.py": "no test yet of its own; exercised by tests/bench/test_smoke.py",
    "bench/runner.py": "no test yet of its own; tested by tests/bench/test_safety.py, test_resume.py, test_results.py",
    "estimators/table_scan.py": "no test file of its own; the ranks' scans and their merge are tested in "
                                "tests/training/test_sharded_reads.py (with the sampler they feed) and test_multinode.py",
}


def _expected_test_file(module: Path) -> Path:
    """tests/<package>/test_<module>.py for src/flowgp/<package>/<module>.py (relative paths)."""
    return module.parent / f"test_{module.stem}.py"


def modules_without_tests() -> list[str]:
    """Modules of src/flowgp without their mirrored test file and not in MODULES_WITHOUT_OWN_TESTS, and entries of
    that list that name no module or a module that has its test file by now."""
    out = []
    modules = {path.relative_to(SRC) for path in SRC.rglob("*.py") if path.stem not in ("__init__", "__main__")}
    for module in sorted(modules):
        has = (TESTS / _expected_test_file(module)).is_file()
        listed = module.as_posix() in MODULES_WITHOUT_OWN_TESTS
        if not has and not listed:
            out.append(f"src/flowgp/{module.as_posix()} has no tests/{_expected_test_file(module).as_posix()}")
        elif has and listed:
            out.append(f"{module.as_posix()} has its test file now: remove it from MODULES_WITHOUT_OWN_TESTS")
    for name in sorted(set(MODULES_WITHOUT_OWN_TESTS) - {m.as_posix() for m in modules}):
        out.append(f"MODULES_WITHOUT_OWN_TESTS names {name}, which is not a module of src/flowgp")
    return out


def misplaced_test_folders() -> list[str]:
    """Folders under tests/ holding test files whose path is not a package of src/flowgp (folders of saved files
    the tests read, such as tests/data/saved_0_2_0/, hold no test files)."""
    out = []
    for folder in sorted({p.parent.relative_to(TESTS) for p in TESTS.rglob("test_*.py")}):
        if folder != Path(".") and not (SRC / folder / "__init__.py").is_file():
            out.append(f"tests/{folder.as_posix()}/ holds tests but src/flowgp/{folder.as_posix()} is no package")
    return out


def test_every_module_has_its_test_file():
    assert modules_without_tests() == []


def test_the_test_folders_mirror_the_packages():
    assert misplaced_test_folders() == []


if __name__ == "__main__":
    problems = {"private names": private_access_violations(), "backward()": backward_violations(),
                "global state": global_state_violations(), "import cycles": import_cycles(),
                "layers": layer_violations(), "long functions": long_functions(),
                "docs files over 1 MB": oversized_docs_files(), "runs/ over budget": runs_over_budget(),
                "tests importing benchmarks": benchmark_imports_in_tests(), "benchmark scripts": script_violations(),
                "narration in tests and benchmarks": narration_violations(),
                "modules without their test file": modules_without_tests(),
                "test folders that are no package": misplaced_test_folders()}
    for kind, items in problems.items():
        print(f"## {kind}: {len(items)}")
        for item in items:
            print("  " + item)
    sys.exit(1 if any(problems.values()) else 0)
