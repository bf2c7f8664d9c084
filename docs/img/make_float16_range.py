"""Draws docs/img/float16-range.png, the picture on the first page.

Run from the repository root: `python docs/img/make_float16_range.py`
(needs matplotlib, the `demo` extra). The gradient magnitudes are
illustrative: a log-normal spread centred near 2^-22, as small activation
gradients of a float16 network often are; the scale is the default 2^15.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

OUT = Path(__file__).with_name("float16-range.png")
SCALE_LOG2 = 15


def main() -> None:
    rng = np.random.default_rng(0)
    grads = rng.normal(loc=-22.0, scale=4.0, size=20_000)  # log2 |gradient|
    bins = np.arange(-44, 24, 1.0)
    fig, axes = plt.subplots(2, 1, figsize=(8, 4.2), sharex=True)
    rows = ((grads, "gradients of the loss"),
            (grads + SCALE_LOG2, "gradients of loss \u00d7 2$^{15}$"))
    for ax, (data, title) in zip(axes, rows):
        ax.axvspan(-44, -24, color="#d62728", alpha=0.12)
        ax.axvspan(-24, -14, color="#ff7f0e", alpha=0.12)
        ax.axvspan(-14, 16, color="#2ca02c", alpha=0.12)
        ax.axvspan(16, 24, color="#d62728", alpha=0.12)
        lost = data < -24
        ax.hist(data[~lost], bins=bins, color="#1f77b4")
        ax.hist(data[lost], bins=bins, color="#7f7f7f")
        ax.set_yticks([])
        ax.set_title(f"{title}: {lost.mean():.0%} become 0 in float16",
                     fontsize=10, loc="left")
    top = axes[0].get_ylim()[1] * 1.45
    axes[0].set_ylim(0, top)
    for x, text in ((-34, "0 in float16"), (-19, "subnormal\n(few digits)"),
                    (1, "float16 normal range"), (20, "inf")):
        axes[0].text(x, top * 0.95, text, ha="center", va="top", fontsize=8)
    axes[1].set_xlabel("log$_2$ |value|   (float16: smallest 2$^{-24}$, "
                       "normal from 2$^{-14}$, largest 65504 \u2248 2$^{16}$)")
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(OUT)


if __name__ == "__main__":
    main()
