"""`python -m tf_lossscale.compat SCRIPT [ARGS...]`: a legacy script, unchanged.

Installs the shim, then runs SCRIPT as `python SCRIPT ARGS...` would: the
script sees `sys.argv == [SCRIPT, *ARGS]`, `__name__ == "__main__"`, its own
folder first on `sys.path`; its exit code is the process's, and an uncaught
exception prints the traceback Python would print, starting at the script's
own frame (the runner's frames are left out).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import os
import runpy
import signal
import sys
import types
from typing import List, Optional

__all__ = ["main"]

_USAGE = """usage: python -m tf_lossscale.compat SCRIPT [ARGS...]

Runs a TF 2.1-2.15 script that uses the legacy loss-scaling API unchanged on
today's TensorFlow: installs tf_lossscale.compat's shim, then runs SCRIPT as
`python SCRIPT ARGS...` would (same sys.argv, __name__ == "__main__", exit
code and traceback). The shim makes these legacy names work again:

  tf.keras.mixed_precision.experimental (Policy, set_policy, global_policy,
    LossScaleOptimizer)
  tf.keras.mixed_precision.LossScaleOptimizer with get_scaled_loss and
    get_unscaled_gradients, on Keras 3
  tf.train.experimental.{LossScale,FixedLossScale,DynamicLossScale} and
    the same under tf.mixed_precision.experimental; the TF1
    MixedPrecisionLossScaleOptimizer
  {enable,disable}_mixed_precision_graph_rewrite

example:
  python -m tf_lossscale.compat train.py --epochs 3

To change the source instead, so that it needs no shim:
  python -m tf_lossscale migrate PATH
Documentation: https://tf-lossscale.github.io/tf_lossscale/migrating/"""


def _script_traceback(tb: Optional[types.TracebackType],
                      script: str) -> Optional[types.TracebackType]:
    """`tb` from the script's first frame on; None if it has none."""
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return tb


def _die_of_sigint() -> None:
    """Ends the process as an uncaught KeyboardInterrupt ends Python's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _run_file(path: str) -> None:
    """Executes the file `path` as Python's own `__main__`, as CPython does.

    runpy.run_path would set `sys.argv[0]` to the absolute path, and only
    for the run; Python keeps it as typed and replaces `__main__` for good.
    """
    main_module = types.ModuleType("__main__")
    main_module.__file__ = path
    vars(main_module).update(__cached__=None, __builtins__=builtins)
    main_module.__loader__ = importlib.machinery.SourceFileLoader(
        "__main__", path)
    main_module.__spec__ = None
    sys.modules["__main__"] = main_module
    with open(path, "rb") as f:  # bytes: the file's coding cookie applies.
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, vars(main_module))  # noqa: S102 (running it is the point)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs `argv[0]` (default `sys.argv[1:]`) with the shim; exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    script = argv[0]
    if not os.path.exists(script):
        print(f"{sys.executable}: can't open file {os.path.abspath(script)!r}"
              ": [Errno 2] No such file or directory", file=sys.stderr)
        return 2
    # Imported only now, so that `--help` answers without TensorFlow.
    import tf_lossscale
    from tf_lossscale.compat import shim
    tf_lossscale.LossScaleOptimizer  # noqa: B018 (loads and registers all)
    shim.install()
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    path = os.path.abspath(script)  # Python >= 3.9 makes __file__ absolute.
    try:
        if os.path.isfile(path):
            _run_file(path)
        else:  # A folder or zip file with a __main__.py.
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as e:  # noqa: B036 (printed as Python would)
        tb = _script_traceback(e.__traceback__, path)
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        if isinstance(e, KeyboardInterrupt):
            _die_of_sigint()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
