"""Running a small legacy program in this process, under the shim or not
(the migrate tests compare the two)."""

import tf_lossscale.compat


def run(source, shim):
    """Executes `source` with the shim installed or not; its globals."""
    namespace = {"__name__": "__legacy__"}
    if shim:
        tf_lossscale.compat.install()
    try:
        exec(compile(source, "<legacy>", "exec"), namespace)
    finally:
        if shim:
            tf_lossscale.compat.uninstall()
    return namespace


def result_of(source, shim):
    """The `result` that `source` sets, run with the shim installed or not."""
    return run(source, shim)["result"]
