"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_cli_quiet.py
describes; its docstring says what they check."""

from __future__ import annotations

import pytest

from test_cli_quiet import stderr_of  # noqa: F401, F811 - shared with the fast part

BARS = {
    "tqdm imported after the call": (
        "",
        "from tqdm import tqdm\nfor _ in tqdm(range(3), desc='bar'): pass\n",
    ),
    "tqdm imported before the call (a reused worker)": (
        "from tqdm.auto import tqdm\n",
        "for _ in tqdm(range(3), desc='bar'): pass\n",
    ),
    "transformers and huggingface_hub already imported": (
        "from transformers.utils import logging\nimport huggingface_hub.utils as hub\n",
        "for _ in logging.tqdm(range(3), desc='bar'): pass\n"
        "for _ in hub.tqdm(range(3), desc='bar'): pass\n"
        "logging.get_logger('transformers.modeling_utils').warning('bar: a loading warning')\n",
    ),
}


@pytest.mark.parametrize("case", list(BARS))
def test_no_progress_bar_reaches_stderr_after_the_call(case: str):
    before, draw = BARS[case]
    assert "bar" in stderr_of(before, draw, silence=False)  # the control: the bars are drawn
    assert stderr_of(before, draw, silence=True) == ""
