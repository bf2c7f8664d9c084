"""Command line: `python -m tf_lossscale {demo,bench,migrate}`.

Each subcommand is a thin adapter that imports its module lazily (so that
`--help` does not pay for importing TensorFlow) and returns an exit code;
the logic lives in `demo.py`, `bench.py` and `migrate.py`.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

__all__ = ["build_parser", "main"]


def _demo(args: argparse.Namespace) -> int:
    from tf_lossscale import demo
    return demo.run(steps=args.steps, out_dir=args.out)


def _bench(args: argparse.Namespace) -> int:
    from tf_lossscale import bench
    return bench.run(quick=args.quick, json_path=args.json)


def _migrate(args: argparse.Namespace) -> int:
    from tf_lossscale.compat import migrate
    return migrate.run(paths=args.paths, write=args.write)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tf_lossscale",
        description="Loss scaling for mixed-precision TensorFlow training.")
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
        "bench", help="benchmark against Keras' own LossScaleOptimizer")
    bench.add_argument("--quick", action="store_true",
                       help="a shorter run (under 100 s)")
    bench.add_argument("--json", default=None, metavar="PATH",
                       help="also write the results as JSON to PATH")
    bench.set_defaults(run=_bench)

    migrate = commands.add_parser(
        "migrate", help="rewrite legacy loss-scaling code to the current "
        "API (a unified diff by default)")
    migrate.add_argument("paths", nargs="+", metavar="PATH",
                         help="Python files or folders to rewrite")
    migrate.add_argument("--write", action="store_true",
                         help="rewrite the files in place instead of "
                         "printing a diff")
    migrate.set_defaults(run=_migrate)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Parses `argv` (default: `sys.argv[1:]`) and runs the subcommand."""
    args = build_parser().parse_args(argv)
    return args.run(args)
