"""`python -m tf_lossscale demo`: what it prints and what it writes."""

import csv
import math
import os
import re
import struct
import subprocess
import sys
import time

import pytest

from tf_lossscale import demo

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run_demo(out, steps=60, env=None):
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tf_lossscale", "demo", "--steps", str(steps),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, time.monotonic() - start


def _read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def _png_size(path):
    """(width, height) from the PNG header, after checking the signature."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_demo_prints_intro_progress_bar_summary_and_writes_csv_and_png(
        tmp_path):
    out = tmp_path / "out"
    printed, elapsed = _run_demo(out)
    lines = printed.splitlines()

    # Two lines say what it shows and why its settings are extreme.
    assert lines[0].startswith("Demo: ") and "loss_scale" in lines[0]
    assert "skipped_steps" in lines[0]
    assert "2^24" in lines[1] and "every 10 good steps" in lines[1]
    assert "Extreme on purpose" in lines[1]
    # The progress bar, with the monitor's values in it: counts as
    # integers, 80 columns, and (not a terminal here) one plain line per
    # epoch, no escape code or carriage return.
    assert "Epoch 4/4" in printed and "15/15" in printed
    bars = [line for line in lines if re.match(r"\d+/15  ", line)]
    assert len(bars) == 4, lines
    for line in bars:
        assert re.fullmatch(r"15/15  loss: \d+\.\d{4}  loss_scale: 2\^\d+  "
                            r"skipped_steps: \d+  skip_streak: \d+", line)
        assert len(line) <= 80, line
    assert "\x1b" not in printed and "\r" not in printed and "\b" not in printed
    # A short summary ends it, instead of the trajectory.
    bar_end = max(i for i, line in enumerate(lines) if "15/15" in line)
    tail = lines[bar_end + 1:]
    assert len(tail) == 6, tail
    # The monitor's line for the overflow planted in a known layer.
    assert re.fullmatch(r"LossScaleMonitor named the non-finite gradients of "
                        r"each of \d+ runs of skipped steps .*the planted "
                        r"overflow:", tail[3]), tail[3]
    assert re.fullmatch(r"  step \d+ skipped on replica 0: Inf entered at "
                        r"\S*hidden_2 in the backward pass \(the loss was "
                        r"finite\); 1 of 6 gradients non-finite: "
                        r"\S*hidden_2/kernel; scale 2\^\d+ -> 2\^\d+",
                        tail[4]), tail[4]
    final_loss = float(re.fullmatch(
        r"Final loss: (\d+\.\d+) \(mean of the last epoch; the first "
        r"epoch's was \d+\.\d+\)\.", tail[0]).group(1))
    skipped = int(re.match(r"Skipped steps: (\d+) of 60 ", tail[1]).group(1))
    settled = re.fullmatch(
        r"Loss scale: started at 2\^24, settled (?:between )?2\^(\d+)"
        r"(?: and 2\^(\d+))? in the last epoch \(now 2\^(\d+)\)\.", tail[2])
    assert settled, tail[2]
    png, csv_path = out / demo.PNG_NAME, out / demo.CSV_NAME
    assert tail[5] == (f"Wrote {png} (plot) and {csv_path} (loss, loss "
                       "scale and skipped flag per step).")

    columns, rows = _read_csv(csv_path)
    assert tuple(columns) == demo.CSV_COLUMNS
    assert len(rows) == 60
    assert [int(r["step"]) for r in rows] == list(range(1, 61))
    assert [int(r["epoch"]) for r in rows] == [e for e in (1, 2, 3, 4)
                                               for _ in range(15)]
    assert {r["skipped"] for r in rows} == {"0", "1"}
    assert sum(int(r["skipped"]) for r in rows) == skipped >= 2
    scales = [float(r["loss_scale"]) for r in rows]
    assert scales[0] == 2.0**24 and rows[0]["skipped"] == "1"
    assert all(math.log2(s).is_integer() for s in scales)
    # A skipped step halves the scale the next one uses; the scale grew too.
    for row, next_scale in zip(rows, scales[1:]):
        if row["skipped"] == "1":
            assert next_scale == float(row["loss_scale"]) / 2
    assert any(b > a for a, b in zip(scales, scales[1:]))
    losses = [float(r["loss"]) for r in rows]
    assert all(0 < loss < 10 for loss in losses)
    assert final_loss == pytest.approx(sum(losses[45:]) / 15, abs=2e-4)
    last_epoch = {int(math.log2(s)) for s in scales[45:]}
    low, high, now = settled.groups()
    assert int(low) <= min(last_epoch | {int(now)})
    assert int(high or low) >= max(last_epoch | {int(now)})

    assert _png_size(png) == (1100, 770)  # 10 x 7 inches at 110 dpi.
    assert png.stat().st_size > 20_000  # Curves and text, not a blank.
    assert elapsed < 90  # About 10 s on an idle machine.


def test_without_matplotlib_it_says_how_to_install_and_writes_the_csv(
        tmp_path):
    # A `matplotlib` that cannot be imported shadows the installed one.
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ImportError('no matplotlib here')\n")
    out = tmp_path / "out"
    printed, _ = _run_demo(out, steps=8,
                           env={"PYTHONPATH": str(shadow.parent)})
    last = printed.splitlines()[-1]
    assert "matplotlib is not installed" in last
    assert 'pip install "tf_lossscale[demo]"' in last
    assert 'pip install ".[demo]"' in last
    assert (out / demo.CSV_NAME).exists()
    assert not (out / demo.PNG_NAME).exists()
    _, rows = _read_csv(out / demo.CSV_NAME)
    assert len(rows) == 8


def _history():
    """Two epochs of 3 steps: skips at 1 and 5, a growth after step 3."""
    return [demo.Step(1, 1, 0.9, 2.0**24, True),
            demo.Step(2, 1, 0.8, 2.0**23, False),
            demo.Step(3, 1, 0.7, 2.0**23, False),
            demo.Step(4, 2, 0.5, 2.0**24, False),
            demo.Step(5, 2, 0.4, 2.0**24, True),
            demo.Step(6, 2, 0.3, 2.0**23, False)]


def test_summary_names_final_loss_skips_and_where_the_scale_settled():
    text = demo.summary(_history(), final_scale=2.0**23)
    assert text.splitlines() == [
        "Final loss: 0.4000 (mean of the last epoch; the first epoch's was "
        "0.8000).",
        "Skipped steps: 2 of 6 (their float16 gradients overflowed: not "
        "applied, and the scale backed off).",
        "Loss scale: started at 2^24, settled between 2^23 and 2^24 in the "
        "last epoch (now 2^23).",
    ]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plot.png"
    demo.plot(_history(), str(path))
    assert _png_size(path) == (1100, 770)


def test_the_plot_points_at_the_planted_step_only_when_told():
    pytest.importorskip("matplotlib")

    def planted_notes(fig):
        scale_ax = fig.axes[1]
        return [(t.get_text().splitlines()[0], t.xy) for t in scale_ax.texts
                if t.get_text().startswith("planted")]

    assert planted_notes(demo._figure(_history(), planted=5)) == [
        ("planted: hidden_2's gradient overflows", (5, 2.0**24))]
    assert planted_notes(demo._figure(_history(), planted=None)) == []


def test_minor_log_ticks_are_labelled_at_2_3_and_5_only():
    labels = [demo._sparse_number(v) for v in (0.02, 0.03, 0.04, 0.05, 0.07,
                                               0.2, 3.0)]
    assert labels == ["0.02", "0.03", "", "0.05", "", "0.2", "3"]


def test_the_bar_line_fits_80_columns_with_integer_counts():
    line = demo.bar_line(7, 1500, 0.5, 2.0**24, 123456, 0)
    assert line == ("   7/1500  loss: 0.5000  loss_scale: 2^24  "
                    "skipped_steps: 123456  skip_streak: 0")
    assert len(line) <= 80


def test_demo_rejects_a_non_positive_step_count(capsys):
    assert demo.run(steps=0, out_dir="unused") == 2
    assert "--steps must be a positive number" in capsys.readouterr().out
