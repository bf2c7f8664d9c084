"""`python -m tf_lossscale demo`: what it prints and writes."""

import csv
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

from tf_lossscale import demo

SVG = "{http://www.w3.org/2000/svg}"


def test_demo_trains_skips_overflows_and_writes_the_plot(tmp_path):
    out = tmp_path / "out"
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tf_lossscale", "demo", "--steps", "60",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout
    assert "Epoch 4/4" in printed and "15/15" in printed  # Progress bar.
    assert "overflow: step skipped" in printed
    assert "grew after 10 finite steps" in printed
    skipped = int(re.search(r"Skipped steps: (\d+) of 60", printed).group(1))
    assert skipped >= 2

    with open(out / "trajectory.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, 61))
    assert sum(int(r["skipped"]) for r in rows) == skipped
    scales = [float(r["loss_scale"]) for r in rows]
    assert scales[0] == 2.0**23  # The first step overflowed at 2**24.
    assert any(b > a for a, b in zip(scales, scales[1:]))  # It grew.
    final = re.search(r"Final loss scale: \S+ \((2\^\d+)\)", printed)
    assert final.group(1) == f"2^{int(scales[-1]).bit_length() - 1}"

    root = ET.parse(out / "loss_scale.svg").getroot()
    assert root.tag == SVG + "svg"
    assert len(root.findall(f"{SVG}polyline[@class='scale']")) == 1
    assert len(root.findall(f"{SVG}circle[@class='skipped']")) == skipped
    assert elapsed < 120  # Well under a minute on an idle machine.


def test_svg_plot_marks_each_skipped_step():
    history = [demo.Step(1, 2.0**23, 0, True), demo.Step(2, 2.0**23, 1, False),
               demo.Step(3, 2.0**22, 0, True), demo.Step(4, 2.0**23, 0, False)]
    root = ET.fromstring(demo.svg_plot(history))
    circles = root.findall(f"{SVG}circle[@class='skipped']")
    assert len(circles) == 2
    (line,) = root.findall(f"{SVG}polyline")
    assert len(line.get("points").split()) == 1 + 2 * len(history)


def test_demo_rejects_a_non_positive_step_count(capsys):
    assert demo.run(steps=0, out_dir="unused") == 2
    assert "--steps must be a positive number" in capsys.readouterr().out
