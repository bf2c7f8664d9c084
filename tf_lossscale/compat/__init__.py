"""Source-tree stand-in for `tf_lossscale.compat`, whose code is in compat/.

`pip install .` copies the repository's compat/ folder to
tf_lossscale/compat/ (setup.cfg's package_dir), and never ships this file.
When tf_lossscale is imported from the source tree (an editable install,
or the repository root on sys.path), this file is found first: it loads
compat/__init__.py as `tf_lossscale.compat` and puts that module in
sys.modules in its own place, which the import system then returns.
"""

import importlib.util
import os
import sys

_COMPAT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))), "compat")
_spec = importlib.util.spec_from_file_location(
    __name__, os.path.join(_COMPAT, "__init__.py"),
    submodule_search_locations=[_COMPAT])
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)
