"""The benchmark harness (benchmarks/): it runs, and it times first calls
fairly. Nothing here checks a timing: the smoke test runs every workload
at the least cost (`--mode tiny`), the rest checks how the harness
combines the seconds it is given."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from tf_lossscale import finite_xla

REPO = Path(__file__).resolve().parent.parent


def test_bench_harness_runs_every_workload_and_prints_a_table(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--mode",
         "tiny", "--json", str(out), "--record-cost"],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    _renders_as_markdown(done.stdout)
    for heading in ("| row | SGD ms |", "| row | step ms |",
                    "| row | big: ms |", "| row | n = 10 |",
                    "| target | measured | met |"):
        assert heading in done.stdout
    result = json.loads(out.read_text())
    for keras in ("keras3", "tf_keras"):
        # Each flavour against its own original, in its own process.
        rows = result[keras]["a"]["SGD"]["rows"]
        assert {"plain", "barrier", keras, "ours"} <= set(rows)
        assert all(r["median_ms"] > 0 for r in rows.values())
        assert {"plain", keras, "ours documented"} <= set(
            result[keras]["b"]["rows"])
        for case in ("big", "small"):
            assert {"plain", keras, "ours", "one read"} <= set(
                result[keras]["c"][case]["rows"])
    # Each scaler row's first call is the median of fresh instances'.
    for keras in ("keras3", "tf_keras"):
        for rows in (result[keras]["a"]["SGD"]["rows"],
                     result[keras]["c"]["big"]["rows"],
                     result[keras]["e"]["SGD"]["rows"],
                     result[keras]["f"]["rows"]):
            assert len(rows["plain"]["first_calls_s"]) == 1
            assert len(rows[keras]["first_calls_s"]) == 2
            assert len(rows["ours" if "ours" in rows else "ours documented"]
                       ["first_calls_s"]) == 2
        assert len(result[keras]["f"]["rows"]["ours documented"]
                   ["first_calls_s"]) == 2
    assert "(medians of 2 and 2)" in done.stdout
    assert result["keras3"]["b"]["flows"]["ours"] == "keras"
    assert result["tf_keras"]["b"]["flows"]["tf_keras"] == "documented"
    names = [t["target"] for t in result["targets"]]
    for flavour in ("Keras 3", "tf_keras"):
        assert any(n.startswith(f"(b) {flavour}") and "documented flow: "
                   "ours <= original / 2" in n for n in names)
    d = result["keras3"]["d"]
    assert d["per gradient count"]["10"]["ours"]["fusions"] > 0
    # Under XLA: (e) and (f), with the limit row and issue 21's targets.
    assert "#### Under XLA" in done.stdout
    for keras in ("keras3", "tf_keras"):
        assert {"plain", "limit", keras, "ours"} <= set(
            result[keras]["e"]["SGD"]["rows"])
        assert {"plain", "limit", keras, "ours documented"} <= set(
            result[keras]["f"]["rows"])
    assert any(t["target"].startswith("(e) Keras 3, SGD")
               for t in result["xla_targets"])
    # (g) and (h): the transformer with Dropout, without and with XLA, and
    # issue 32's targets (ours <= the original) in both target lists.
    # With AdamW, what keras-hub's models train with (the tiny mode's only
    # optimizer there; the full run's third column).
    for keras in ("keras3", "tf_keras"):
        for letter in ("g", "h"):
            assert set(result[keras][letter]) == {"AdamW"}
            assert {"plain", keras, "ours"} <= set(
                result[keras][letter]["AdamW"]["rows"])
    assert "**(g)** compile + train_on_batch of a transformer with Dropout: " \
        "Embedding(16, 8)" in done.stdout
    assert "**(h)** (g) compiled whole by XLA" in done.stdout
    assert "| row | AdamW ms | AdamW overhead [90%] | AdamW first call s |" in (
        done.stdout)
    assert any(t["target"] == "(g) Keras 3, AdamW: ours <= original"
               for t in result["targets"])
    assert any(t["target"] == "(h) tf_keras, AdamW: ours <= original"
               for t in result["xla_targets"])
    # --record-cost: ours without the skip record, beside ours.
    for keras in ("keras3", "tf_keras"):
        for rows in (result[keras]["a"]["SGD"]["rows"],
                     result[keras]["e"]["SGD"]["rows"],
                     result[keras]["b"]["rows"], result[keras]["f"]["rows"]):
            assert {"ours, no record"} <= set(rows)
    assert "tf_lossscale without the skip record" in done.stdout
    _short_report_from(result)


def _renders_as_markdown(text):
    """The report is pasted into Markdown pages: outside code spans no
    line may leave a `**` open (a footnote mark or `10**6` would turn the
    rest of the line bold; the docs' browser test caught one)."""
    for line in text.splitlines():
        prose = re.sub(r"`[^`]*`", "", line)
        assert prose.count("**") % 2 == 0, line


def _short_report_from(result):
    """The short preset's report, made from the tiny run's rows: its tables
    and its one list of targets (issue 32's), nothing else."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from report import report
        from targets import short_targets
    finally:
        sys.path.pop(0)
    k3, tk = result["keras3"], result["tf_keras"]
    text = report(k3, tk, "short", {"before": [0.1], "after": [0.1]}, 1.0)
    _renders_as_markdown(text)
    assert text.startswith("### Benchmark (`--short`)")
    for part in ("**(a)** compile + train_on_batch", "**(e)** (a) compiled "
                 "whole by XLA", "**(b)** tf.function GradientTape loop",
                 "**(c)** check+unscale", "| row | big: ms |"):
        assert part in text, part
    assert "**(f)**" not in text and "**(g)**" not in text
    names = [t["target"] for t in short_targets(k3, tk)]
    for flavour in ("Keras 3", "tf_keras"):
        for opt in ("SGD",):
            assert f"(a) {flavour}, {opt}: ours <= original" in names
            assert f"(a) {flavour}, {opt}: ours <= barrier + 3 points" in names
            assert (f"(a) {flavour}, {opt}: first call, ours <= original"
                    in names)
        assert f"(c) {flavour}, big: ours <= 2 x one read" in names
        assert f"(c) {flavour}, big: first call, ours <= original" in names
        assert any(n.startswith(f"(b) {flavour}, ") and n.endswith(
            "documented flow: ours <= original / 2") for n in names)
        assert f"(e) {flavour}, SGD: first call, ours <= original" in names
    assert not any(n.startswith(("(f)", "(g)", "(h)", "(c) Keras 3, 20"))
                   for n in names)
    assert "| target | measured | met |" in text


def test_bench_outside_a_checkout_says_the_suite_is_missing(tmp_path):
    # An installed copy of the package, without the repository around it.
    shutil.copytree(REPO / "tf_lossscale", tmp_path / "tf_lossscale")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from tf_lossscale import bench; "
         "sys.exit(bench.run(\"quick\", json_path=None))"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(tmp_path),
                 TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 2
    assert "benchmarks/run.py" in done.stderr
    assert "source checkout" in done.stderr


# --- first calls: the median of fresh instances, each as a new process's

@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import common as module
    return module


def _runner(seconds, built=None, name=None):
    """A row's runner whose first call "takes" `seconds`."""
    def run():
        return None
    run.seconds = seconds
    if built is not None:
        built.append((name, seconds))
    return run


def test_a_rows_first_call_is_the_median_of_its_fresh_instances(
        common, monkeypatch):
    monkeypatch.setattr(common, "time_first_call", lambda fn: fn.seconds)
    built = []

    def fresh(name, seconds):
        pending = iter(seconds)
        return lambda: _runner(next(pending), built, name)

    timings = common.interleave(
        {"plain": _runner(1.0), "orig": _runner(2.0), "ours": _runner(9.0)},
        steps=2, collect=False, first_calls=3,
        fresh={"orig": fresh("orig", [6.0, 7.0]),
               "ours": fresh("ours", [3.0, 4.0])})
    # The row's own instance first, then the fresh ones; plain has one.
    assert timings["ours"].first_calls == [9.0, 3.0, 4.0]
    assert timings["ours"].first_call_s == 4.0
    assert timings["orig"].first_call_s == 6.0
    assert timings["plain"].first_calls == [1.0]
    # Each round starts one row later: neither row always comes first.
    assert built == [("ours", 3.0), ("orig", 6.0), ("orig", 7.0),
                     ("ours", 4.0)]
    assert timings["ours"].as_json()["first_calls_s"] == [9.0, 3.0, 4.0]
    assert timings["ours"].as_json()["first_call_s"] == 4.0
    assert [len(t.samples) for t in timings.values()] == [2, 2, 2]


def test_one_first_call_per_row_builds_no_fresh_instance(common,
                                                          monkeypatch):
    monkeypatch.setattr(common, "time_first_call", lambda fn: fn.seconds)
    timings = common.interleave(
        {"ours": _runner(5.0)}, steps=1, collect=False, first_calls=1,
        fresh={"ours": lambda: pytest.fail("built a fresh instance")})
    assert timings["ours"].first_calls == [5.0]


def test_each_first_call_traces_the_verdict_as_a_new_process_would(common):
    """The verdict's trace is reused by any later step of the same gradient
    shapes: timed as a first call, a row must not reuse another's."""
    grads = [tf.ones([3, 19]), tf.ones([19])]
    step = tf.function(lambda g: finite_xla.verdict(g, tf.constant(2.0))[0],
                       jit_compile=True)
    assert bool(step(grads))
    checked = finite_xla._checked
    again = tf.function(lambda g: finite_xla.verdict(g, tf.constant(2.0))[0],
                        jit_compile=True)
    common.time_first_call(lambda: again(grads))
    assert finite_xla._checked is not checked
    assert finite_xla._checked.experimental_get_tracing_count() == 1
    # The step traced before still runs its own trace, and still checks.
    assert not bool(step([tf.fill([3, 19], float("nan")), tf.ones([19])]))
    assert finite_xla._checked.experimental_get_tracing_count() == 1


def test_first_call_targets_are_on_the_medians_and_say_when_they_overlap(
        common):
    import targets
    rows = {"ours": {"first_call_s": 4.0, "first_calls_s": [9.0, 3.0, 4.0]},
            "orig": {"first_call_s": 6.0, "first_calls_s": [2.0, 6.0, 7.0]},
            "apart": {"first_call_s": 10.0,
                      "first_calls_s": [10.0, 11.0, 12.0]},
            "single": {"first_call_s": 5.0}}
    overlapping = targets._first_call_target("t", rows, "ours", "orig")
    assert overlapping["met"] is True and overlapping["noise"] is True
    assert overlapping["measured"] == "4 s vs 6 s (medians of 3 and 3)"
    apart = targets._first_call_target("t", rows, "apart", "orig")
    assert apart["met"] is False and apart["noise"] is False
    single = targets._first_call_target("t", rows, "single", "orig")
    assert single["noise"] is None and single["measured"] == "5 s vs 6 s"


# --- fit_floor.py: what (a)'s step must cost

def test_fit_floor_rows_apply_what_they_say_and_its_table_prints(
        common, capsys):
    """The one-read row applies the gradients as plain SGD does; the
    division row applies them divided by the scale (a power of two, so
    exactly); `main` prints every row over the plain one."""
    import keras
    import numpy as np

    import fit_floor
    x = np.ones((4, 8), "float32")
    y = np.full((4, 8), 8.0, "float32")
    moves = {}
    makers = fit_floor.makers("SGD")
    for row in ("plain", "one read", "divide + one read"):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(
            8, kernel_initializer="zeros")])
        model.compile(optimizer=makers[row](), loss="mse")
        model.train_on_batch(x, y)
        moves[row] = model.get_weights()[0]
    assert np.all(moves["plain"] > 0)
    np.testing.assert_array_equal(moves["one read"], moves["plain"])
    np.testing.assert_array_equal(
        moves["divide + one read"] * fit_floor.SCALE, moves["plain"])
    assert fit_floor.main(["--steps", "2", "--layers", "1",
                           "--width", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "Keras 3, 1 x Dense(8), batch 64, SGD, no XLA, 2 steps a row")
    assert [line.split(" ms ")[0].rsplit(None, 1)[0].strip()
            for line in lines[1:]] == list(makers)
    with pytest.raises(SystemExit):
        fit_floor.main(["--steps", "0"])
    assert common.optimizer_error(keras, "SGD") is None
    assert common.optimizer_error(keras, "Sgd") == (
        "--optimizer 'Sgd' is not a class of keras.optimizers (SGD, Adam, "
        "AdamW, ...)")


def _one_fit_step(make, y_value):
    """The optimizer `make()` after one `fit` step of a Dense(4) whose
    targets are all `y_value`."""
    import keras
    import numpy as np
    optimizer = make()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    model.train_on_batch(np.ones((2, 4), "float32"),
                         np.full((2, 4), y_value, "float32"))
    return optimizer


def test_fit_floor_read_rows_read_the_gradients(common):
    """The read the floor rows wait for is made: its verdict lands in a
    variable, True on finite gradients and False on infinite ones (a
    verdict that only fed control edges was dropped by Grappler, and the
    rows then cost no read)."""
    import fit_floor
    makers = fit_floor.makers("SGD")
    for row in ("one read", "divide + one read"):
        assert bool(_one_fit_step(makers[row], 1.0).verdict_written)
        assert not bool(_one_fit_step(makers[row], float("inf"))
                        .verdict_written)


def test_fit_floor_runs_on_tf_keras(common):
    """`TF_USE_LEGACY_KERAS=1` runs every row on tf_keras (its optimizers
    take their gradients in `apply_gradients`)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "fit_floor.py"),
         "--steps", "2", "--layers", "1", "--width", "8",
         "--optimizer", "Adam"],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_USE_LEGACY_KERAS="1",
                 TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == ("tf_keras, 1 x Dense(8), batch 64, Adam, no XLA, "
                        "2 steps a row")
    assert [line.split(" ms ")[0].rsplit(None, 1)[0].strip()
            for line in lines[1:]] == [
        "plain", "barrier", "one read", "divide + one read", "Keras' own",
        "tf_lossscale"]


def test_cond_cost_check_without_skip_reads_the_gradients(common):
    """cond_cost's "check, no skip" row makes its check (the verdict lands
    in a variable) and still applies an infinite gradient (it never
    skips)."""
    import cond_cost
    finite = _one_fit_step(
        lambda: cond_cost.ProbeSGD("check, no skip", learning_rate=1e-4),
        1.0)
    assert bool(finite.verdict_written)
    infinite = _one_fit_step(
        lambda: cond_cost.ProbeSGD("check, no skip", learning_rate=1e-4),
        float("inf"))
    assert not bool(infinite.verdict_written)
    assert int(infinite.iterations) == 1


def test_paired_over_is_the_median_of_same_round_ratios(common):
    """Round i of a row is divided by round i of plain: a row twice as
    slow in every round is +100% whatever the rounds' spread."""
    timings = {"plain": common.Timing([1.0], [1.0, 4.0, 2.0]),
               "twice": common.Timing([1.0], [2.0, 8.0, 4.0]),
               "mixed": common.Timing([1.0], [1.5, 4.0, 1.0])}
    over = common.paired_over(timings)
    assert over == {"plain": 0.0, "twice": 1.0, "mixed": 0.0}


def test_print_over_prints_each_rows_median_and_paired_median(
        common, capsys):
    """The stand-alone scripts' table: a row's median step in its unit
    and its paired median over the base row, the labels aligned."""
    timings = {"wait": common.Timing([1.0], [0.002, 0.004, 0.003]),
               "one call": common.Timing([1.0], [0.003, 0.006, 0.0045])}
    common.print_over(timings, base="wait")
    common.print_over(timings, base="wait", unit="us")
    assert capsys.readouterr().out.splitlines() == [
        "  wait        3.00 ms   +0.0% over wait",
        "  one call    4.50 ms  +50.0% over wait",
        "  wait        3000 us   +0.0% over wait",
        "  one call    4500 us  +50.0% over wait"]


# --- check_cost.py: where (c) big's time goes

def test_check_cost_rows_are_real_checks_and_its_table_prints(
        common, capsys):
    """A cost compared is a cost of the same answer: every row that checks
    says False when one value is Inf (and the rows that only read or
    divide say True)."""
    import check_cost
    values = [tf.Variable(tf.fill([3, 4], 8.0)), tf.Variable(tf.ones([4]))]
    scale = tf.Variable(4.0)
    finite_rows = {name: run() for name, run in
                   check_cost.rows(values, scale).items()}
    values[0].assign(tf.tensor_scatter_nd_update(
        tf.fill([3, 4], 8.0), [[2, 3]], [float("inf")]))
    inf_rows = {name: run() for name, run in
                check_cost.rows(values, scale).items()}
    only_read = {"plain", "divide only"}
    assert set(finite_rows) == {
        "plain", "one read", "divide only", "tf_lossscale",
        "tf_lossscale, one XLA kernel", "sums of the inputs",
        "add_n per shape", "Keras 3"}
    assert all(bool(v) for v in finite_rows.values())
    assert {k for k, v in inf_rows.items() if bool(v)} == only_read
    assert check_cost.main(["--tensors", "1", "--steps", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| 2 tensors, 0.4M floats | ms |")
    assert [line.split(" | ")[0] for line in table[2:]] == [
        "| plain", "| one read", "| divide only", "| tf_lossscale",
        "| tf_lossscale, one XLA kernel", "| sums of the inputs",
        "| add_n per shape", "| Keras 3"]


# --- branch_cost.py: the update inside a conditional run as one call

def _branch_ops(step):
    """Whether each If op of a traced branch_cost step is to be lowered
    (False: kept as one call)."""
    graph = step.run.get_concrete_function().graph
    return [op.get_attr("_lower_using_switch_merge")
            for op in graph.get_operations()
            if op.type in ("If", "StatelessIf")]


def test_branch_cost_rows_update_or_skip_as_they_say(common, capsys):
    """Every row applies a finite step; with an infinite scale's quotients
    (scale 0) the conditional rows skip (weights kept, the other branch
    read the quotients) and the rows without one apply. The one-call row's
    conditional is kept as one call, the lowered row's is not."""
    import branch_cost
    for scale, finite in ((branch_cost.SCALE, True), (0.0, False)):
        for row in branch_cost.ROWS:
            step = branch_cost.Step(row, tensors=2, size=4)
            step.scale.assign(scale)
            step.lr.assign(1.0)
            before = [w.numpy() for w in step.weights]
            step.run()
            applied = finite or row in ("no verdict", "wait")
            assert int(step.applied) == int(applied), (row, scale)
            moved = [not (w.numpy() == b).all()
                     for w, b in zip(step.weights, before)]
            assert moved == [applied, applied], (row, scale)
            if row in ("one call", "lowered"):
                assert float(step.recorded) == (0.0 if finite
                                                else float("inf"))
            if row == "wait":
                assert bool(step.verdict_written) == finite
    assert _branch_ops(branch_cost.Step("one call", 2, 4)) == [False]
    assert _branch_ops(branch_cost.Step("lowered", 2, 4)) == [True]
    assert branch_cost.main(["--tensors", "2", "--size", "4",
                             "--steps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2 x (4 x 4) float32")
    assert [line.split()[0] for line in lines[1:]] == [
        "no", "wait", "one", "lowered"]
    assert "+0.0% over wait" in lines[2]
    with pytest.raises(SystemExit):
        branch_cost.main(["--tensors", "0"])


def test_hlo_step_counts_the_transformers_compiled_steps(tmp_path):
    """`hlo_step.py --model transformer` compiles (h)'s step of each row
    and counts it: no conditional in the plain step, Keras' own one (apply
    or skip), ours three (apply or skip, the exact verdict, the skip
    record: the last two run only when the quick check fails)."""
    out = tmp_path / "hlo.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "hlo_step.py"),
         "--model", "transformer", "--mode", "tiny", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(out.read_text())
    assert list(counts) == ["AdamW fit plain", "AdamW fit keras3",
                            "AdamW fit ours"]
    conditionals = {k: v["conditionals"] for k, v in counts.items()}
    assert conditionals == {"AdamW fit plain": 0, "AdamW fit keras3": 1,
                            "AdamW fit ours": 3}
    assert counts["AdamW fit plain"]["kernels_in_branches"] == 0
    for row in ("AdamW fit keras3", "AdamW fit ours"):
        # AdamW's update (every variable, both moments) is in a branch.
        assert counts[row]["kernels_in_branches"] > 35 * 2
    assert "AdamW fit ours" in done.stdout


def test_vocab_cost_rows_apply_the_same_step_and_its_table_prints(
        common, capsys):
    """vocab_cost's three rows move the embedding alike in a step (a
    row's cost is its check, not another update), the embedding's
    gradient is the `tf.IndexedSlices` whose check the script is about,
    and `main` prints every row over the plain one."""
    import keras
    import numpy as np

    import vocab_cost
    rng = np.random.default_rng(1)
    x = rng.integers(0, 64, (vocab_cost.BATCH, vocab_cost.TOKENS))
    y = rng.integers(0, vocab_cost.CLASSES, vocab_cost.BATCH)
    moved = {}
    for row in vocab_cost.ROWS:
        model = vocab_cost._model(row, "SGD", 64, 8, False)
        before = model.get_weights()[0]
        model.train_on_batch(x.astype("int32"), y)
        moved[row] = model.get_weights()[0] - before
    assert np.abs(moved["plain"]).max() > 0
    # Both scale the loss by 2**15 and divide by it: the same bits. The
    # plain step's float16 gradients round otherwise, so only closely.
    np.testing.assert_array_equal(moved["tf_lossscale"], moved["Keras' own"])
    np.testing.assert_allclose(moved["Keras' own"], moved["plain"],
                               rtol=0.01, atol=1e-9)
    model = vocab_cost._model("plain", "SGD", 64, 8, False)
    with tf.GradientTape() as tape:
        loss = model.compute_loss(
            x=None, y=tf.constant(y),
            y_pred=model(tf.constant(x.astype("int32"))))
    gradient = tape.gradient(loss, model.trainable_variables[0])
    assert isinstance(gradient, tf.IndexedSlices)
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert vocab_cost.main(["--vocab", "64", "--width", "8",
                            "--steps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("Keras 3, Embedding(64, 8), 16 x 32 tokens, SGD, "
                        "no XLA, 2 steps a row")
    assert [line.split(" ms ")[0].rsplit(None, 1)[0].strip()
            for line in lines[1:]] == list(vocab_cost.ROWS)


# On tf_keras, one SGD step of each vocab_cost row: a line with the Keras,
# whether the plain row moved the table and whether ours moved it as tf_keras'
# own; then `main`'s table (Adam, 2 steps). One process: one TF start-up.
_VOCAB_ON_TF_KERAS = """
import numpy as np
import vocab_cost
rng = np.random.default_rng(1)
x = rng.integers(0, 64, (vocab_cost.BATCH, vocab_cost.TOKENS)).astype("int32")
y = rng.integers(0, vocab_cost.CLASSES, vocab_cost.BATCH)
moved = {}
for row in vocab_cost.ROWS:
    model = vocab_cost._model(row, "SGD", 64, 8, False)
    before = model.get_weights()[0]
    model.train_on_batch(x, y)
    moved[row] = model.get_weights()[0] - before
print(vocab_cost.keras.__name__,
      "moved" if np.abs(moved["plain"]).max() > 0 else "still",
      "same" if np.array_equal(moved["tf_lossscale"], moved["Keras' own"])
      else "differs")
vocab_cost.main(["--vocab", "64", "--width", "8", "--steps", "2",
                 "--optimizer", "Adam"])
"""


def test_vocab_cost_runs_on_tf_keras(common):
    """`TF_USE_LEGACY_KERAS=1` runs the three rows on tf_keras, whose own
    wrapper is `tf_keras.mixed_precision.LossScaleOptimizer`."""
    done = subprocess.run(
        [sys.executable, "-c", _VOCAB_ON_TF_KERAS], cwd=REPO / "benchmarks",
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_USE_LEGACY_KERAS="1",
                 TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    # tf_keras' own reads the rows as ours does: the same bits here too.
    assert lines[0].split() == ["tf_keras", "moved", "same"]
    assert lines[1] == ("tf_keras, Embedding(64, 8), 16 x 32 tokens, Adam, "
                        "no XLA, 2 steps a row")
    assert [line.split(" ms ")[0].rsplit(None, 1)[0].strip()
            for line in lines[2:]] == ["plain", "Keras' own", "tf_lossscale"]
