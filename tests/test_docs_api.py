"""The API reference of the documentation site (docs/api) documents exactly the public API, each name with a
docstring. The public API is defined in docs/_ext/public_api.py: flowgp.__all__ (a submodule named there
standing for its own __all__), the __all__ of every package of flowgp, and the modules the user guide imports from.
"""
import ast
import dataclasses
import doctest
import re
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


# ----- parameters and examples of every public callable ----------------------------------------------------------
# A callable's docstring documents its parameters in a napoleon section: Google style ("Args:" / "Parameters:" /
# "Keyword Args:" / "Other Parameters:", one "name: text" or "name (remark): text" entry per line at the section's
# first indent, several names of one meaning as "a, b: text") or numpydoc style ("Parameters" underlined, entries
# "name : type"). The names must be exactly the signature's (a class's: its constructor's).
_GOOGLE_HEADER = re.compile(r"^(\s*)(Args|Arguments|Parameters|Keyword Args|Keyword Arguments|Other Parameters)"
                            r"(?: \(.+\))?:\s*$")
_NUMPY_HEADERS = ("Parameters", "Other Parameters")
_ENTRY = re.compile(r"^(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?:\([^)]*\))?\s*:(?:\s|$)")
_NUMPY_ENTRY = re.compile(r"^(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::|$)")
_ANY_SECTION = re.compile(r"^\s*[A-Z][A-Za-z ]+(?: \(.+\))?:\s*$")


def documented_parameters(doc: str, fields: bool = False) -> list[str] | None:
    """The parameter names a docstring's parameter sections document (None: it has no such section); with
    `fields` (a dataclass or named tuple, whose parameters are its fields) an "Attributes:" section counts too."""
    lines, names, found = doc.splitlines(), [], False
    i = 0
    while i < len(lines):
        header = _GOOGLE_HEADER.match(lines[i]) or (fields and re.match(r"^(\s*)Attributes:\s*$", lines[i]))
        numpy = (lines[i].strip() in _NUMPY_HEADERS and i + 1 < len(lines)
                 and set(lines[i + 1].strip()) == {"-"})
        if not header and not numpy:
            i += 1
            continue
        found = True
        base = len(lines[i]) - len(lines[i].lstrip())
        i += 2 if numpy else 1
        entry_indent = None
        while i < len(lines):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            if line.strip():
                if (not numpy and indent <= base) or (numpy and indent <= base and (
                        i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"} or _ANY_SECTION.match(line))):
                    break
                if entry_indent is None:
                    entry_indent = indent
                if indent == entry_indent:
                    match = (_NUMPY_ENTRY if numpy else _ENTRY).match(line.strip())
                    assert match, (f"not a parameter entry: {line.strip()!r} (an entry is 'name: text' or "
                                   "'a, b: text', its names on one line)")
                    names += [n.strip().lstrip("*") for n in match.group(1).split(",")]
            i += 1
    return names if found else None


def _own_constructor(cls) -> bool:
    """Whether a class's constructor is flowgp's (a warning class or a protocol takes Python's)."""
    for klass in cls.__mro__:
        function = vars(klass).get("__init__") or vars(klass).get("__new__")
        if function is not None:
            function = getattr(function, "__func__", function)
            return (getattr(function, "__module__", None) or klass.__module__).startswith(("flowgp", "namedtuple"))
    return False


def _has_fields(obj) -> bool:
    return inspect.isclass(obj) and (dataclasses.is_dataclass(obj) or hasattr(obj, "_fields"))


def signature_parameters(obj) -> list[str]:
    if inspect.isclass(obj) and not _own_constructor(obj):
        return []
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p.name for p in signature.parameters.values() if p.name not in ("self", "cls")]


_REFERENCE = re.compile(r":(?:py:)?(?:func|class|meth|mod|obj|attr|data|exc):`[^`]+`")


def has_example_or_reference(doc: str) -> bool:
    """An "Examples:" section with a doctest, or a "See Also:" section / reST role naming another object."""
    examples = re.search(r"^\s*Examples?:\s*$", doc, re.M) and ">>>" in doc
    see_also = re.search(r"^\s*See Also:?\s*$", doc, re.M)
    return bool(examples or see_also or _REFERENCE.search(doc))


def _callables():
    return {name: obj for name, obj in public_api.public_api().items()
            if inspect.isclass(obj) or inspect.isroutine(obj)}


def test_every_public_callable_documents_exactly_its_parameters():
    problems = []
    for name, obj in _callables().items():
        expected = signature_parameters(obj)
        try:
            documented = documented_parameters(inspect.getdoc(obj) or "", fields=_has_fields(obj))
        except AssertionError as error:
            problems.append(f"{name}: {error}")
            continue
        if not expected:
            continue
        if documented is None:
            problems.append(f"{name}: no parameters section (needs {expected})")
            continue
        missing = [p for p in expected if p not in documented]
        stale = [p for p in documented if p not in expected]
        twice = sorted({p for p in documented if documented.count(p) > 1})
        if missing or stale or twice:
            problems.append(f"{name}: undocumented {missing}, not parameters {stale}, documented twice {twice}")
    assert not problems, "\n".join(problems)


def test_every_public_callable_has_an_example_or_a_reference():
    lacking = [name for name, obj in _callables().items() if not has_example_or_reference(inspect.getdoc(obj) or "")]
    assert not lacking, f"docstrings without an Examples section or a See Also / :role: reference: {lacking}"


def test_documented_parameters_reads_google_and_numpy_sections():
    google = ("Summary.\n\nArgs:\n    a: first.\n        more about a: still a.\n    b, c (meaning): two.\n"
              "    **rest: the others.\nReturns:\n    x: not a parameter.\n")
    assert documented_parameters(google) == ["a", "b", "c", "rest"]
    numpy = "Summary.\n\nParameters\n----------\na : int\n    first.\nb\n    second.\n\nReturns\n-------\nint\n"
    assert documented_parameters(numpy) == ["a", "b"]
    assert documented_parameters("Summary only.") is None
    assert documented_parameters("S.\n\nAttributes:\n    a: x.\n") is None
    assert documented_parameters("S.\n\nAttributes:\n    a: x.\n", fields=True) == ["a"]
    assert has_example_or_reference("S.\n\nSee Also:\n    :func:`flowgp.make_flow`\n")
    assert has_example_or_reference("S.\n\nExamples:\n    >>> 1 + 1\n    2\n")
    assert not has_example_or_reference("S.\n\nArgs:\n    a: `flowgp.make_flow`.\n")


def test_parameter_check_sees_missing_and_stale_names():
    def f(a, b, *, c=1):
        """F.

        Args:
            a: one.
            d: gone.
        """
    assert signature_parameters(f) == ["a", "b", "c"]
    assert documented_parameters(inspect.getdoc(f)) == ["a", "d"]


def _examples():
    return sorted(name for name, obj in _callables().items() if ">>>" in (inspect.getdoc(obj) or ""))


@pytest.mark.parametrize("name", _examples())
def test_the_docstring_examples_run(name):
    # the examples of the API reference are doctests: each runs as written and prints what it shows
    obj = public_api.public_api()[name]
    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in finder.find(obj, name, globs={}) if t.examples]
    assert tests, f"{name}: no doctest found"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (output above)"
