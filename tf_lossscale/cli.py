"""Command line: `python -m tf_lossscale {demo,bench,migrate}`.

Each subcommand is a thin adapter that imports its module lazily (so that
`--help` does not pay for importing TensorFlow) and returns an exit code.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from tf_lossscale import demo
    return demo.run(steps=args.steps, out_dir=args.out)


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
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Parses `argv` (default: `sys.argv[1:]`) and runs the subcommand."""
    args = build_parser().parse_args(argv)
    return args.run(args)
