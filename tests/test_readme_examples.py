"""README's Keras 3 examples run as written (each block asserts itself)."""

import pathlib
import re

import keras
import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _section_blocks(name):
    text = README.read_text()
    start = text.index(f"<!-- section:{name} -->")
    end = text.find("<!-- section:", start + 1)
    section = text[start:end if end != -1 else len(text)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


BLOCKS = _section_blocks("keras3")


def test_the_section_holds_the_fit_and_the_gradient_tape_examples():
    assert len(BLOCKS) == 2
    assert "model.fit(" in BLOCKS[0]
    assert "tf.GradientTape()" in BLOCKS[1]


@pytest.mark.parametrize("block", BLOCKS, ids=["compile_fit",
                                                "gradient_tape"])
def test_example_runs_as_written(block):
    namespace = {"__name__": "readme_example"}
    try:
        exec(compile(block, str(README), "exec"), namespace)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert "opt" in namespace  # It ran to the end, asserts included.
