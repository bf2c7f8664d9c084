"""Running a small legacy program in this process, under the shim or not
(the migrate tests compare the two)."""

import tf_lossscale.compat


def result_of(source, shim):
    """The `result` that `source` sets, run with the shim installed or not."""
    namespace = {}
    if shim:
        tf_lossscale.compat.install()
    try:
        exec(compile(source, "<program>", "exec"), namespace)
    finally:
        if shim:
            tf_lossscale.compat.uninstall()
    return namespace["result"]
