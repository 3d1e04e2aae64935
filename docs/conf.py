"""Sphinx configuration of the flowgp documentation site.

Build (from the repository root, after ``pip install -e ".[docs]"``)::

    sphinx-build -W --keep-going -n -b html docs docs/_build/html

``-W`` turns warnings into errors and ``-n`` reports every cross-reference that does not resolve, so the site
builds clean or not at all. The build needs no network: links to the documentation of PyTorch, NumPy,
scikit-learn and Python go through small inventories shipped in ``docs/_intersphinx`` (see ``README.md``
there), never through a download.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))
if (ROOT / "src" / "flowgp").is_dir():  # document this checkout even if another flowgp is installed
    sys.path.insert(0, str(ROOT / "src"))

import flowgp  # noqa: E402

project = "flowgp"
author = "the flowgp developers"
copyright = "the flowgp developers"
release = flowgp.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax served from the site itself: pages render offline
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "flowgp_docs",  # docs/_ext: API coverage, references to re-exported names, "Reproducing the papers"
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# docs/results holds measurements (read by the "Reproducing the papers" page, not pages themselves);
# gallery_src holds the example scripts that sphinx-gallery turns into auto_examples/.
exclude_patterns = ["_build", "results", "gallery_src", "_intersphinx", "_ext", "_templates", "README.md",
                    "**/README.md", "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.json", "auto_examples/*.codeobj.json"]
templates_path = ["_templates"]
nitpicky = True
#: names the type hints use that no shipped inventory defines as a class: numpy's `ArrayLike` alias and the
#: `np.` spellings of numpy's classes (autodoc keeps annotations as written), argparse's formatters
nitpick_ignore = [("py:class", name) for name in (
    "ArrayLike", "np.ndarray", "np.random.RandomState", "np.random.Generator",
    "argparse.RawDescriptionHelpFormatter", "argparse.ArgumentDefaultsHelpFormatter")]

# ----- autodoc / autosummary / napoleon ----------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_param = False  # parameter types as text: flowgp's "name (meaning): ..." is prose, not a type
napoleon_use_keyword = False
add_module_names = False
python_use_unqualified_type_names = True

# ----- intersphinx: shipped inventories, no download ---------------------------------------------------------
_INV = HERE / "_intersphinx"
intersphinx_mapping = {
    "python": ("https://docs.python.org/3/", (str(_INV / "python.inv"),)),
    "torch": ("https://docs.pytorch.org/docs/stable/", (str(_INV / "torch.inv"),)),
    "numpy": ("https://numpy.org/doc/stable/", (str(_INV / "numpy.inv"),)),
    "sklearn": ("https://scikit-learn.org/stable/", (str(_INV / "sklearn.inv"),)),
}
intersphinx_disabled_reftypes = ["std:doc"]
intersphinx_timeout = 5

# ----- MyST ------------------------------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# ----- sphinx-gallery -------------------------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": "gallery_src",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "backreferences_dir": None,
    "download_all_examples": False,
    "remove_config_comments": True,
    "min_reported_time": 0,
    "show_memory": False,
    "capture_repr": (),
    "abort_on_example_error": False,
    "only_warn_on_example_error": False,
    "plot_gallery": os.environ.get("FLOWGP_DOCS_GALLERY", "True"),
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
    "write_computation_times": True,
}

# ----- HTML ------------------------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"flowgp {release}"
html_static_path = []
html_show_sourcelink = False
html_theme_options = {"navigation_with_keys": True}
