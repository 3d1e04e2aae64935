"""Sphinx extension of the flowgp site.

- At the start of a build, compares the names the API reference documents with the public API
  (`public_api`) and warns about every difference, so ``-W`` fails a build whose reference is incomplete.
- Resolves references to flowgp objects written with another import path of the same object (a signature's
  base class ``flowgp.estimators.base.Estimator`` links to the page of ``flowgp.estimators.Estimator``); a
  reference to an existing but non-public flowgp object (a config dataclass in a return annotation) is shown
  as plain text instead of a broken link. A name that does not exist still warns.
- Registers the ``flowgp-reproduction`` directive of the "Reproducing the papers" page (`reproduction`).
"""
from __future__ import annotations

import importlib
import re

from sphinx.util import logging

import public_api

logger = logging.getLogger(__name__)
_CANONICAL: dict[int, str] | None = None


def _import(path: str):
    """The object at a dotted path (module prefix imported, the rest looked up as attributes), or None."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def check_api_coverage(app) -> None:
    public = set(public_api.public_api())
    documented = public_api.documented_names()
    duplicates = sorted({n for n in documented if documented.count(n) > 1})
    for name in sorted(public - set(documented)):
        logger.warning("public name %s is missing from the API reference (docs/api/*.rst)", name)
    for name in sorted(set(documented) - public):
        logger.warning("the API reference documents %s, which is not public or not its canonical name "
                       "(see docs/_ext/public_api.py)", name)
    for name in duplicates:
        logger.warning("the API reference lists %s twice", name)


def _qualified(obj) -> str | None:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else None


def _bare_name_target(node) -> str | None:
    """A bare name in a signature whose annotations could not be evaluated (a name imported only under
    ``TYPE_CHECKING`` leaves the whole signature as strings), or in a docstring's role: look it up in the modules
    that define the documented object (named by its page, ``api/generated/<name>``) and its base classes."""
    target = node.get("reftarget", "")
    if "." in target or not target.isidentifier() or not node.get("py:module"):
        return None
    owners = [_import(node["py:module"] + (f".{node['py:class']}" if node.get("py:class") else ""))]
    page = node.get("refdoc", "")
    if page.startswith("api/generated/"):
        owners.append(_import(page.split("/")[-1]))
    modules = []
    for owner in owners:
        if isinstance(owner, type):
            modules += [cls.__module__ for cls in owner.__mro__]
        elif getattr(owner, "__module__", None):
            modules.append(owner.__module__)
    for name in modules + [node["py:module"]]:
        obj = getattr(importlib.import_module(name), target, None)
        if obj is not None and _qualified(obj) is not None:
            return _qualified(obj)
    return None


_resolving = False


def resolve_flowgp_reference(app, env, node, contnode):
    global _CANONICAL, _resolving
    if node.get("refdomain") != "py" or _resolving:
        return None
    target = node.get("reftarget", "")
    qualified = _bare_name_target(node)
    if qualified is not None and qualified != target:
        retry = node.deepcopy()
        retry["reftarget"] = qualified
        _resolving = True
        try:
            ref = app.emit_firstresult("missing-reference", env, retry, contnode)
            if ref is None:
                ref = env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                                         qualified, retry, contnode)
        finally:
            _resolving = False
        if ref is None and qualified.startswith("flowgp."):
            return resolve_flowgp_reference(app, env, retry, contnode)
        return ref
    if not target.startswith("flowgp."):
        return None
    obj = _import(target)
    if obj is None:
        return None  # a name that does not exist: let Sphinx warn
    if _CANONICAL is None:
        _CANONICAL = public_api.canonical_names()
    canonical = _CANONICAL.get(id(obj))
    if canonical is not None and canonical != target:
        domain = env.get_domain("py")
        for reftype in (node.get("reftype"), "class", "func", "obj"):
            ref = domain.resolve_xref(env, node["refdoc"], app.builder, reftype, canonical, node, contnode)
            if ref is not None:
                return ref
    if canonical is None:
        return contnode  # exists, not public: plain text
    return None


# ----- docstrings ----------------------------------------------------------------------------------------------
# flowgp's docstrings are plain text in the Google style ("Args:", "Returns:") with Markdown-like `code` spans and
# formulas such as |x|, a*b or y_ that reStructuredText would read as markup. Before napoleon parses them, code
# spans become literals (a `flowgp.x.y` path becomes a link) and the characters that would start markup outside
# literals are escaped; docstrings of attributes and constants are kept out of napoleon (which would read the
# text before a colon as a type).
_CODE = re.compile(r"(?<![`:\w])`([^`\n]+?)`(?![`\w])")
_PATH = re.compile(r"flowgp(\.[A-Za-z_]\w*)+")
_LITERAL = re.compile(r"``.+?``|:[a-z:]+:`[^`]+`")
_SPECIAL = re.compile(r"(\|)|(?<![\\*])(\*{1,2})(?=\S)|(?<=\w)(_{1,2})(?=[^\w]|$)")
_RAW_KINDS = ("attribute", "data", "property")
_kept: dict[str, list[str]] = {}


def _code(match) -> str:
    text = match.group(1).strip()
    if _PATH.fullmatch(text):
        return f":py:obj:`{text}`"
    return f"``{text}``" if text else match.group(0)


def _escaped(match) -> str:
    return "".join("\\" + c for c in match.group(0))


def _escape_outside_literals(line: str) -> str:
    out, last = [], 0
    for m in _LITERAL.finditer(line):
        out.append(_SPECIAL.sub(_escaped, line[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(_SPECIAL.sub(_escaped, line[last:]))
    return "".join(out)


def _is_flowgp(obj, name: str) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return name.startswith("flowgp.") or module.startswith("flowgp")


_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Returns?|Yields|Raises|Attributes|Keyword Args|Keyword "
                      r"Arguments|Other Parameters|Warns|Examples?|Notes?|Warnings?|See Also|References|Todo|Methods)"
                      r"(?: \((.+)\))?:\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _normalise_layout(lines: list[str]) -> list[str]:
    """Napoleon section headers with a remark ("Args (beyond SVGP's):") become a remark and a header; outside
    sections and literal blocks, a line indented deeper than the line before it (a wrapped sentence or a
    formula on its own line, which reStructuredText would reject as an unexpected indentation) joins that line."""
    out: list[str] = []
    section_indent = literal_indent = None
    for line in lines:
        if not line.strip():
            out.append(line)
            continue
        indent = _indent(line)
        if section_indent is not None and indent <= section_indent:
            section_indent = None
        if literal_indent is not None and indent <= literal_indent:
            literal_indent = None
        header = _SECTION.match(line)
        if header and literal_indent is None:
            if header.group(3):
                out += [f"{header.group(1)}({header.group(3)})", ""]
            out.append(f"{header.group(1)}{header.group(2)}:")
            section_indent = indent
            continue
        previous = out[-1] if out else ""
        if (section_indent is None and literal_indent is None and previous.strip()
                and indent > _indent(previous) and not previous.rstrip().endswith("::")):
            out[-1] = previous.rstrip() + " " + line.strip()
            continue
        if line.rstrip().endswith("::") and literal_indent is None:
            literal_indent = indent
        out.append(line)
    return out


def _foreign_inherited(what: str, name: str, obj) -> bool:
    """Whether a method without a docstring of its own would show one inherited from outside flowgp
    (``torch.nn.Module.forward``'s, which refers to torch's own pages)."""
    if what != "method" or getattr(obj, "__doc__", None):
        return False
    owner = _import(name.rsplit(".", 1)[0])
    attr = name.rsplit(".", 1)[1]
    for cls in getattr(owner, "__mro__", ()):
        member = cls.__dict__.get(attr)
        if member is not None and getattr(member, "__doc__", None):
            return not cls.__module__.startswith("flowgp")
    return False


def prepare_docstring(app, what, name, obj, options, lines) -> None:
    """Before napoleon: make a flowgp docstring safe reStructuredText (see the comment above)."""
    if not _is_flowgp(obj, name):
        return
    if _foreign_inherited(what, name, obj):
        lines[:] = []
        return
    lines[:] = _normalise_layout(lines)
    if what in _RAW_KINDS or what == "data":
        inherited = getattr(type(obj), "__doc__", None)
        if isinstance(inherited, str) and not isinstance(obj, type) and "\n".join(lines).strip() == inherited.strip():
            lines[:] = []  # a constant without its own comment shows its type's docstring (dict(), tuple())
    in_literal_block = in_doctest = False
    for i, line in enumerate(lines):
        if in_literal_block and line.strip() and not line.startswith((" ", "\t")):
            in_literal_block = False
        # a doctest block (">>>" to the next blank line: the example and its output) is shown as written
        in_doctest = line.lstrip().startswith(">>>") or (in_doctest and bool(line.strip()))
        if not in_literal_block and not in_doctest:
            lines[i] = _escape_outside_literals(_CODE.sub(_code, line))
        if line.rstrip().endswith("::"):
            in_literal_block = True
    if what in _RAW_KINDS:
        _kept[name] = list(lines)


def restore_raw_docstring(app, what, name, obj, options, lines) -> None:
    """After napoleon: attributes and constants keep their prepared text."""
    if what in _RAW_KINDS and name in _kept:
        lines[:] = _kept.pop(name)


def readable_signature(app, what, name, obj, options, signature, return_annotation):
    """A dataclass field with a default factory shows as ``=<factory>``, which is not Python and breaks the
    signature's parsing; show ``=...`` instead."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), return_annotation
    return None


def skip_member(app, what, name, obj, skip, options):
    """Leave out the ``set_*_request`` methods scikit-learn generates on every estimator (its metadata routing,
    documented by scikit-learn)."""
    if re.fullmatch(r"set_\w+_request", name):
        return True
    return None


def setup(app):
    import reproduction

    app.connect("builder-inited", check_api_coverage)
    app.connect("missing-reference", resolve_flowgp_reference)
    app.connect("autodoc-process-docstring", prepare_docstring, priority=400)
    app.connect("autodoc-process-docstring", restore_raw_docstring, priority=600)
    app.connect("autodoc-skip-member", skip_member)
    app.connect("autodoc-process-signature", readable_signature)
    reproduction.setup(app)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
