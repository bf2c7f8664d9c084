"""Command line: `tf-lossscale` or `python -m tf_lossscale`, with the
subcommands demo, bench and migrate.

Each subcommand is a thin adapter that imports its module lazily and returns
an exit code; the logic lives in `demo.py`, `bench.py` and `migrate.py`.
This module itself imports neither TensorFlow nor Keras, so that `--help`
and `--version` answer at once and print none of TensorFlow's start-up lines.
Before the demo it starts TensorFlow quietly (`quiet_tensorflow_start`), so
that its C++ start-up lines do not land between the demo's intro and its
progress bar, unless the user set `TF_CPP_MIN_LOG_LEVEL` themselves.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
from typing import Any, List, Optional, Sequence, Union

__all__ = ["build_parser", "main", "quiet_tensorflow_start", "version"]

# The name `python -m tf_lossscale` gives itself (see __main__.py); the
# console script's name is taken from sys.argv[0].
MODULE_PROG = "python -m tf_lossscale"
SCRIPT_PROG = "tf-lossscale"


def version() -> str:
    """The installed distribution's version; the source tree's if none."""
    from importlib import metadata
    try:
        return metadata.version("tf_lossscale")
    except metadata.PackageNotFoundError:  # run from a source tree
        from tf_lossscale import __version__
        return __version__


def _prog_from_argv0() -> str:
    """How the program was invoked, for usage lines and error messages."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if name in ("__main__.py", "__main__"):
        return MODULE_PROG
    if not name or name.startswith("-"):  # `python -c ...`, an embedder
        return SCRIPT_PROG
    if name.lower().endswith(".exe"):
        name = name[:-4]
    return name


class _VersionAction(argparse.Action):
    """`--version`: reads the version only when asked (metadata is slow
    enough to notice on every `--help`)."""

    def __init__(self, option_strings: Sequence[str], dest: str,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0,
                         default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser,
                 namespace: argparse.Namespace,
                 values: Union[str, Sequence[Any], None],
                 option_string: Optional[str] = None) -> None:
        sys.stdout.write(f"tf_lossscale {version()}\n")
        sys.stdout.flush()
        parser.exit()


# The level set when the user set none: INFO and WARNING lines hidden.
QUIET_LOG_LEVEL = "2"


def quiet_tensorflow_start() -> bool:
    """Imports TensorFlow and Keras and makes its devices, with its C++
    start-up lines kept off the terminal; True if it did so.

    Does nothing (returns False) when the user set `TF_CPP_MIN_LOG_LEVEL`:
    then they asked for what TensorFlow prints. Otherwise it sets the level
    to 2 and, as some lines print whatever the level (absl's "All log
    messages before absl::InitializeLog()", `cudart_stub`, a failed
    `cuInit`, oneDNN's notice at the first float16 op), sends file
    descriptor 2 to a temporary file while TensorFlow starts and runs one
    float16 op. If the start fails, what it printed is written to stderr before
    the exception propagates.
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return False
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = QUIET_LOG_LEVEL
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import keras  # noqa: F401  (loads TensorFlow's backend)
            import tensorflow as tf
            tf.config.list_logical_devices()  # CUDA's probe prints here
            # The first float16 op prints, once per process and at ERROR
            # level, oneDNN's notice on CPUs without AVX-512's half
            # precision ("oneDNN supports DT_HALF only on platforms with
            # AVX-512"): the demo's first step would print it.
            tf.cast(tf.zeros([1]), tf.float16)
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
    return True


def _demo(args: argparse.Namespace) -> int:
    quiet_tensorflow_start()
    from tf_lossscale import demo
    return demo.run(steps=args.steps, out_dir=args.out)


def _bench(args: argparse.Namespace) -> int:
    from tf_lossscale import bench
    return bench.run(preset=args.preset, json_path=args.json, xla=args.xla,
                     record_cost=args.record_cost)


def _migrate(args: argparse.Namespace) -> int:
    from tf_lossscale.compat import migrate
    return migrate.run(paths=args.paths, write=args.write)


_EPILOG = """\
also:
  python -m tf_lossscale.compat SCRIPT [ARGS...]
                        run a TF 2.1-2.15 script that uses the legacy
                        loss-scaling API unchanged, with the shim installed

documentation: https://tf-lossscale.github.io/tf_lossscale/"""

_BENCH_DESCRIPTION = """\
Times a training step with tf_lossscale against the same step with a plain
optimizer and with Keras' own LossScaleOptimizer (Keras 3's and tf_keras'),
each Keras in a process of its own, and prints a Markdown report: a table per
workload (median ms, overhead over the plain step with its 90% interval,
first-call seconds) and the targets each row is held to. The workloads:

  fit          compile + train_on_batch of a 40 x Dense(512) MLP, SGD and
               Adam, without XLA and with jit_compile=True
  loop         a tf.function GradientTape loop over many small layers, in
               the documented flow (get_scaled_loss + get_unscaled_gradients
               + apply_gradients) and Keras 3's (scale_loss + apply_gradients)
  check        get_unscaled_gradients and its finite check alone
  transformer  compile + train_on_batch of a small transformer with Dropout

presets (times on two CPU cores):
  short (default)  {short}
  --targets        {targets}
  --quick          {quick}
  --full           {full}

It needs a source checkout: the suite is benchmarks/ at the repository's
root, not part of the installed package (git clone, pip install -e ., then
run it there). Results of a reference run and what they mean:
https://tf-lossscale.github.io/tf_lossscale/performance/"""


def _bench_description() -> str:
    from tf_lossscale.bench import PRESETS
    width = 78 - 19
    return _BENCH_DESCRIPTION.format(**{
        name: textwrap.fill(text, width).replace("\n", "\n" + " " * 19)
        for name, text in PRESETS.items()})


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; `prog` defaults to how this process was invoked."""
    parser = argparse.ArgumentParser(
        prog=prog or _prog_from_argv0(),
        description="Loss scaling for mixed-precision TensorFlow training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG)
    parser.add_argument("--version", action=_VersionAction,
                        help="print tf_lossscale's version and exit")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="train a small mixed-precision model with dynamic "
        "loss scaling and show the scale trajectory")
    demo.add_argument("--steps", type=int, default=None,
                      help="training steps (default: the demo's own)")
    demo.add_argument("--out", default="demo_out",
                      help="folder for the plot and trajectory (default: "
                      "%(default)s)")
    demo.set_defaults(run=_demo)

    bench = commands.add_parser(
        "bench", help="time a training step against Keras' own "
        "LossScaleOptimizer (needs a source checkout)",
        description=_bench_description(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    preset = bench.add_mutually_exclusive_group()
    preset.add_argument("--targets", dest="preset", action="store_const",
                        const="targets", default="short",
                        help="the targets preset (above)")
    preset.add_argument("--quick", dest="preset", action="store_const",
                        const="quick", help="the quick preset (above)")
    preset.add_argument("--full", dest="preset", action="store_const",
                        const="full", help="the full preset (above)")
    bench.add_argument("--xla", action="store_true",
                       help="only the workloads compiled with XLA "
                       "(jit_compile=True, Keras 3's default for fit on a "
                       "GPU) of the preset")
    bench.add_argument("--record-cost", action="store_true",
                       help="also time tf_lossscale without its skip record "
                       "(what LossScaleOptimizer.last_skip reads), to show "
                       "what the record costs")
    bench.add_argument("--json", default=None, metavar="PATH",
                       help="also write the results as JSON to PATH")
    bench.set_defaults(run=_bench)

    migrate = commands.add_parser(
        "migrate", help="rewrite legacy loss-scaling code to the current "
        "API (a unified diff by default)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Rewrite TF 2.1-2.15 loss-scaling code (tf.train."
        "experimental.*LossScale,\ntf.keras.mixed_precision.experimental, "
        "the graph rewrite, compile under a\nmixed_float16 policy) to "
        "tf_lossscale and today's Keras, so that it runs without\n"
        "the tf_lossscale.compat shim. Files without a loss-scaling name are "
        "not parsed.",
        epilog="examples:\n"
        "  %(prog)s train.py\n"
        "      print the diff of one file, change nothing\n"
        "  %(prog)s --write src/ tests/\n"
        "      rewrite two trees in place, naming each file written\n"
        "\n"
        "exit status:\n"
        "  0  everything was converted\n"
        "  1  something was left as it was: each such line on stderr as\n"
        "     file:line: reason\n"
        "  2  a path does not exist, or a file could not be read, parsed or "
        "written:\n"
        "     each on stderr as file: reason (every other file is still "
        "migrated)")
    migrate.add_argument("paths", nargs="+", metavar="PATH",
                         help="Python files or folders to rewrite")
    migrate.add_argument("--write", action="store_true",
                         help="rewrite the files in place instead of "
                         "printing a diff")
    migrate.set_defaults(run=_migrate)
    return parser


def main(argv: Optional[List[str]] = None,
         prog: Optional[str] = None) -> int:
    """Parses `argv` (default: `sys.argv[1:]`) and runs the subcommand.

    `prog` names the program in usage lines; by default it is taken from
    `sys.argv[0]` (`tf-lossscale` for the console script).
    """
    args = build_parser(prog).parse_args(argv)
    return args.run(args)
