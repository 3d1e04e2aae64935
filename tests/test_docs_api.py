"""The API reference of the documentation site (docs/api) documents exactly the public API, each name with a
docstring. The public API is defined in docs/_ext/public_api.py: flowgp.__all__ (a submodule named there
standing for its own __all__), the __all__ of every package of flowgp, and the modules the user guide imports from.
"""
import ast
import inspect
import sys
import zlib
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import public_api  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "flowgp"


def test_the_api_reference_lists_exactly_the_public_names():
    public = set(public_api.public_api())
    documented = public_api.documented_names()
    assert len(documented) == len(set(documented)), sorted({n for n in documented if documented.count(n) > 1})
    assert not public - set(documented), f"public but not in docs/api/*.rst: {sorted(public - set(documented))}"
    assert not set(documented) - public, f"in docs/api/*.rst but not public: {sorted(set(documented) - public)}"


def test_every_package_that_declares_all_is_public():
    # the rule has no hand-kept list of packages: a package with an __all__ is public as soon as it exists
    packages = {p.parent for p in SRC.rglob("__init__.py") if not any(part.startswith("_") for part in
                                                                       p.parent.relative_to(SRC).parts)}
    declared = {p for p in packages if "__all__" in (p / "__init__.py").read_text()}
    modules = {name for name, _ in public_api.public_modules()}
    for package in declared:
        dotted = ".".join(("flowgp",) + package.relative_to(SRC).parts) if package != SRC else "flowgp"
        assert dotted in modules, dotted


def _constant_documented(canonical: str) -> bool:
    """A module-level constant is documented by a `#:` comment above its assignment or a string literal
    right after it (what autodoc reads), where it is assigned: in its module, else (a re-export) wherever in
    flowgp it is assigned."""
    module, name = canonical.rsplit(".", 1)
    own = SRC.joinpath(*module.split(".")[1:])
    own = own / "__init__.py" if own.is_dir() else own.with_suffix(".py")
    found = _assignment_documented(own, name)
    if found is not None:
        return found
    return any(_assignment_documented(path, name) for path in SRC.rglob("*.py"))


def _assignment_documented(path: Path, name: str):
    """True / False when `path` assigns `name` at module level with / without documentation, else None."""
    if path.exists():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for i, node in enumerate(tree.body):
            targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                       if isinstance(node, ast.AnnAssign) else [])
            if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
                continue
            above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
            after = tree.body[i + 1] if i + 1 < len(tree.body) else None
            return above.startswith("#:") or (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                                              and isinstance(after.value.value, str))
    return None


def test_every_public_name_has_a_docstring():
    missing = []
    for name, obj in public_api.public_api().items():
        if inspect.isclass(obj) or inspect.isroutine(obj):
            doc = inspect.getdoc(obj)
            if not doc or not doc.strip().splitlines()[0].strip():
                missing.append(name)
        elif not _constant_documented(name):
            missing.append(name)
    assert not missing, f"public names without a docstring (or a #: comment for constants): {missing}"


def _inventory_names(path: Path) -> set[str]:
    data = path.read_bytes()
    body = zlib.decompress(data.split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines() if line}


def test_a_built_site_documents_every_public_name():
    inventory = DOCS / "_build" / "html" / "objects.inv"
    if not inventory.exists():
        pytest.skip("the site is not built here (sphinx-build -W --keep-going -n -b html docs docs/_build/html)")
    names = _inventory_names(inventory)
    missing = sorted(set(public_api.public_api()) - names)
    assert not missing, f"the built site has no entry for {missing} (rebuild it?)"


def test_documented_names_reads_currentmodule_and_tilde(tmp_path):
    (tmp_path / "a.rst").write_text(".. currentmodule:: flowgp.flows\n\n.. autosummary::\n   :toctree: generated\n\n"
                                    "   Log\n   ~flowgp.flows.Exp\n\nText after.\n")
    assert public_api.documented_names(tmp_path) == ["flowgp.flows.Log", "flowgp.flows.Exp"]
