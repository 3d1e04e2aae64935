"""What "the public API of flowgp" means, in one place: the API reference must document exactly these names.

The public API is the union of the ``__all__`` lists of

1. ``flowgp`` itself, where a submodule named in ``flowgp.__all__`` (``flows``, ``kernels``, ...) stands for the
   names in its own ``__all__``;
2. every package of flowgp (a folder with an ``__init__.py``, no part of its name starting with ``_``) whose
   ``__init__`` declares ``__all__`` - found by walking the package, so a new package with an ``__all__`` is
   public the moment it exists;
3. the modules in :data:`EXTRA_PUBLIC_MODULES`: modules that are not packages but that the user guide tells
   users to import from.

Every object is documented once, under its *canonical name*: the first module in the order above whose
``__all__`` lists it (``flowgp.TGPRegressor``, not ``flowgp.estimators.TGPRegressor``).
`documented_names` reads the names that the API reference's ``autosummary`` directives list
(``docs/api/*.rst``); ``tests/test_docs_api.py`` checks that the two sets are equal.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
import types
from pathlib import Path

#: modules (not packages) whose ``__all__`` is public because the user guide imports from them
EXTRA_PUBLIC_MODULES = (
    "flowgp.registry",
    "flowgp.numerics.constraints",
    "flowgp.training.initialisation",
    "flowgp.training.natural_gradients",
    "flowgp.training.distributed",
    "flowgp.models.latent.diagnostics",
    "flowgp.data.synthetic",
    "flowgp.data.tables",
    "flowgp.data.images",
    "flowgp.cli",
    "flowgp.bench.cli",
    "flowgp.bench.models",
    "flowgp.bench.presets",
    "flowgp.bench.results",
)

API_DIR = Path(__file__).resolve().parents[1] / "api"


def _public_packages() -> list[str]:
    import flowgp

    names = []
    for info in pkgutil.walk_packages(flowgp.__path__, "flowgp."):
        if info.ispkg and not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def public_modules() -> list[tuple[str, list[str]]]:
    """[(module name, its public names)] in the order that decides canonical names."""
    import flowgp

    top, expanded = [], []
    for name in flowgp.__all__:
        obj = getattr(flowgp, name)
        if isinstance(obj, types.ModuleType):
            expanded.append((obj.__name__, list(obj.__all__)))
        else:
            top.append(name)
    out = [("flowgp", top)] + expanded
    for name in _public_packages() + list(EXTRA_PUBLIC_MODULES):
        module = importlib.import_module(name)
        if hasattr(module, "__all__"):
            out.append((name, list(module.__all__)))
    return out


def public_api() -> dict[str, object]:
    """{canonical name: object} of every public name (see the module docstring for the rule)."""
    api, seen = {}, {}
    for module_name, names in public_modules():
        module = importlib.import_module(module_name)
        for name in names:
            obj = getattr(module, name)
            key = _identity(obj, module_name, name)
            if key in seen:
                continue
            seen[key] = f"{module_name}.{name}"
            api[f"{module_name}.{name}"] = obj
    return api


def _identity(obj, module_name: str, name: str):
    """Objects are the same name wherever they are re-exported; plain values (numbers, strings) are not
    objects with an identity of their own, so each (module, name) holding one is a name of its own."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return ("value", module_name, name)
    return id(obj)


def canonical_names() -> dict[int, str]:
    """{id(object): canonical name} for the classes and functions of the public API (for resolving a
    reference written with another path of the same object, e.g. ``flowgp.estimators.base.Estimator``)."""
    return {id(obj): name for name, obj in public_api().items()
            if isinstance(obj, (type, types.FunctionType))}


_DIRECTIVE = re.compile(r"^\.\. autosummary::\s*$")


def documented_names(api_dir: Path = API_DIR) -> list[str]:
    """The names listed by the ``autosummary`` directives of the API reference's ``.rst`` files, with the
    ``currentmodule`` in force at each directive prefixed (as autosummary does)."""
    names = []
    for path in sorted(api_dir.glob("*.rst")):
        current, lines, i = None, path.read_text().splitlines(), 0
        while i < len(lines):
            line = lines[i]
            if line.startswith(".. currentmodule::"):
                current = line.split("::", 1)[1].strip()
            if _DIRECTIVE.match(line):
                i += 1
                while i < len(lines) and (not lines[i].strip() or lines[i].startswith("   ")):
                    entry = lines[i].strip()
                    if entry and not entry.startswith(":"):
                        entry = entry.lstrip("~")
                        names.append(entry if current is None or entry.startswith("flowgp.")
                                     else f"{current}.{entry}")
                    i += 1
                continue
            i += 1
    return names
