"""Sphinx configuration of cynorm's API reference.

Build it (from the checkout, after `pip install ".[docs]"`):

    sphinx-build -W --keep-going -b html docs docs/_build/html

The reference is autodoc'ed from the installed package's docstrings
(numpydoc style).  -W makes every warning an error, among them the one this
file adds: a public name (in the __all__ of a documented module) that no
page documents.
"""
import importlib

import cynorm

project = "cynorm"
author = "the cynorm developers"
copyright = "2026, the cynorm developers"
release = version = cynorm.__version__

extensions = ["sphinx.ext.autodoc", "numpydoc", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

autodoc_typehints = "none"          # the numpydoc sections carry the types
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
# every documented function's docstring has a summary, a Parameters entry
# (with a type and a description) for each of its parameters and no other,
# and a Returns section when it returns something: a warning otherwise,
# which -W makes an error
numpydoc_validation_checks = {"GL08", "SS01", "PR01", "PR02", "PR03", "PR04", "PR10",
                              "RT01", "RT03"}
myst_heading_anchors = 3

html_theme = "alabaster"
html_static_path = []

# every public name of these modules must be documented on some page
DOCUMENTED_MODULES = ["cynorm", "cynorm.aten", "cynorm.nested", "cynorm.distributed",
                      "cudnn_bind"]
# the adapters' pages, where their framework is installed; documented from
# their source without it
autodoc_mock_imports = []
for _framework, _module in (("torch", "cynorm.torch"), ("jax", "cynorm.jax")):
    try:
        importlib.import_module(_framework)
        DOCUMENTED_MODULES.append(_module)
    except ImportError:
        autodoc_mock_imports.append(_framework)
if autodoc_mock_imports:
    # the adapters register rules in their framework's tables at import
    # (cynorm/_jax_forward.py: jax's `ad.primitive_transposes[p] = ...`),
    # which the stand-in must take too
    from sphinx.ext.autodoc.mock import _MockObject
    _MockObject.__setitem__ = lambda self, key, value: None
# modules and data that are not documented as objects of their own
NOT_OBJECTS = {"cynorm": {"__version__", "aten", "nested", "distributed"}}


def _check_every_public_name_documented(app, env):
    from sphinx.util import logging
    log = logging.getLogger("cynorm.docs")
    documented = set(env.get_domain("py").objects)
    for modname in DOCUMENTED_MODULES:
        module = importlib.import_module(modname)
        for name in getattr(module, "__all__", ()):
            if name in NOT_OBJECTS.get(modname, ()):
                continue
            obj = getattr(module, name)
            # a name re-exported from another documented module counts once
            home = f"{getattr(obj, '__module__', modname)}.{name}"
            if f"{modname}.{name}" not in documented and home not in documented:
                log.warning(f"public name {modname}.{name} is not documented on any page")


def setup(app):
    app.connect("env-check-consistency", _check_every_public_name_documented)
