"""Write the small intersphinx inventories the site links through (python.inv, torch.inv, numpy.inv, sklearn.inv).

Why shipped files: the site must build with ``-W -n`` (every warning an error, every reference checked) on
machines without network access, CI's included. ``intersphinx_mapping`` in ``docs/conf.py`` names these files as
the inventory locations, so a build never downloads anything and links still point at the official sites.
Each file lists only the names flowgp's pages and signatures refer to; when a new docstring or signature
refers to another name of these projects, the build reports it as a missing reference: add it to ``ENTRIES``
below and run ``python docs/_intersphinx/make_inventories.py`` (the files are committed).

A name is listed under every import path that signatures show for it (``torch.nn.Module`` and
``torch.nn.modules.module.Module``), all pointing at the public page.
"""
from __future__ import annotations

import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: {project: (base URL, [(name, role, page)])}; page is relative to the base URL, "$" = "#" + name
ENTRIES = {
    "python": ("https://docs.python.org/3/", [
        ("pathlib.Path", "py:class", "library/pathlib.html$"),
        ("os.PathLike", "py:class", "library/os.html$"),
        ("collections.abc.Callable", "py:class", "library/collections.abc.html$"),
        ("collections.abc.Iterable", "py:class", "library/collections.abc.html$"),
        ("collections.abc.Iterator", "py:class", "library/collections.abc.html$"),
        ("collections.abc.Mapping", "py:class", "library/collections.abc.html$"),
        ("collections.abc.Sequence", "py:class", "library/collections.abc.html$"),
        ("typing.Any", "py:data", "library/typing.html$"),
        ("typing.Callable", "py:data", "library/typing.html$"),
        ("typing.Iterator", "py:class", "library/typing.html$"),
        ("typing.Mapping", "py:class", "library/typing.html$"),
        ("typing.Sequence", "py:class", "library/typing.html$"),
        ("typing.Literal", "py:data", "library/typing.html$"),
        ("dataclasses.dataclass", "py:function", "library/dataclasses.html$"),
        ("UserWarning", "py:exception", "library/exceptions.html$"),
        ("RuntimeWarning", "py:exception", "library/exceptions.html$"),
        ("RuntimeError", "py:exception", "library/exceptions.html$"),
        ("ValueError", "py:exception", "library/exceptions.html$"),
        ("TypeError", "py:exception", "library/exceptions.html$"),
        ("Exception", "py:exception", "library/exceptions.html$"),
        ("argparse.ArgumentParser", "py:class", "library/argparse.html$"),
        ("argparse.Namespace", "py:class", "library/argparse.html$"),
    ]),
    "torch": ("https://docs.pytorch.org/docs/stable/", [
        ("torch.Tensor", "py:class", "tensors.html$"),
        ("torch.dtype", "py:class", "tensor_attributes.html$"),
        ("torch.device", "py:class", "tensor_attributes.html$"),
        ("torch.Generator", "py:class", "generated/torch.Generator.html$"),
        ("torch._C.Generator", "py:class", "generated/torch.Generator.html#torch.Generator"),
        ("torch.Size", "py:class", "size.html$"),
        ("torch.nn.Module", "py:class", "generated/torch.nn.Module.html$"),
        ("torch.nn.modules.module.Module", "py:class", "generated/torch.nn.Module.html#torch.nn.Module"),
        ("torch.nn.Parameter", "py:class", "generated/torch.nn.parameter.Parameter.html"
                                           "#torch.nn.parameter.Parameter"),
        ("torch.nn.parameter.Parameter", "py:class", "generated/torch.nn.parameter.Parameter.html$"),
        ("torch.nn.ModuleList", "py:class", "generated/torch.nn.ModuleList.html$"),
        ("torch.nn.modules.container.ModuleList", "py:class",
         "generated/torch.nn.ModuleList.html#torch.nn.ModuleList"),
        ("torch.nn.Linear", "py:class", "generated/torch.nn.Linear.html$"),
        ("torch.optim.Optimizer", "py:class", "optim.html$"),
        ("torch.optim.optimizer.Optimizer", "py:class", "optim.html#torch.optim.Optimizer"),
        ("torch.optim.Adam", "py:class", "generated/torch.optim.Adam.html$"),
        ("torch.optim.adam.Adam", "py:class", "generated/torch.optim.Adam.html#torch.optim.Adam"),
        ("torch.optim.Optimizer.state_dict", "py:method", "generated/torch.optim.Optimizer.state_dict.html$"),
        ("torch.optim.Optimizer.load_state_dict", "py:method",
         "generated/torch.optim.Optimizer.load_state_dict.html$"),
        ("torch.compile", "py:function", "generated/torch.compile.html$"),
        ("torch.distributed", "py:module", "distributed.html#module-torch.distributed"),
        ("torch.distributed.init_process_group", "py:function", "distributed.html$"),
    ]),
    "numpy": ("https://numpy.org/doc/stable/", [
        ("numpy.ndarray", "py:class", "reference/generated/numpy.ndarray.html$"),
        ("numpy.dtype", "py:class", "reference/generated/numpy.dtype.html$"),
        ("numpy.random.Generator", "py:class", "reference/random/generator.html$"),
        ("numpy.memmap", "py:class", "reference/generated/numpy.memmap.html$"),
    ]),
    "sklearn": ("https://scikit-learn.org/stable/", [
        ("sklearn.base.BaseEstimator", "py:class", "modules/generated/sklearn.base.BaseEstimator.html$"),
        ("sklearn.base.RegressorMixin", "py:class", "modules/generated/sklearn.base.RegressorMixin.html$"),
        ("sklearn.base.ClassifierMixin", "py:class", "modules/generated/sklearn.base.ClassifierMixin.html$"),
        ("sklearn.model_selection.GridSearchCV", "py:class",
         "modules/generated/sklearn.model_selection.GridSearchCV.html$"),
        ("sklearn.model_selection.cross_val_score", "py:function",
         "modules/generated/sklearn.model_selection.cross_val_score.html$"),
        ("sklearn.model_selection.KFold", "py:class", "modules/generated/sklearn.model_selection.KFold.html$"),
        ("sklearn.pipeline.Pipeline", "py:class", "modules/generated/sklearn.pipeline.Pipeline.html$"),
    ]),
}


def inventory_bytes(project: str, version: str, entries) -> bytes:
    header = (f"# Sphinx inventory version 2\n# Project: {project}\n# Version: {version}\n"
              "# The remainder of this file is compressed using zlib.\n").encode()
    lines = []
    for name, role, page in sorted(entries):
        uri = page.replace("$", "#$") if page.endswith("$") else page
        lines.append(f"{name} {role} 1 {uri} -\n")
    return header + zlib.compress("".join(lines).encode())


def main() -> None:
    for project, (_url, entries) in ENTRIES.items():
        (HERE / f"{project}.inv").write_bytes(inventory_bytes(project, "stable", entries))
        print(f"wrote {HERE / f'{project}.inv'} ({len(entries)} names)")


if __name__ == "__main__":
    main()
