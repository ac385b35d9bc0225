"""Third-party progress bars and chatter off inside the Ray tasks that train runs.

A Ray worker's stderr is forwarded to the driver's terminal, so a bar drawn by Hugging Face
("Loading weights", "Fetching files"), tqdm or datasets in a task lands above the driver's rich
display and breaks it. The driver's display is where progress belongs; the workers stay quiet.

Each library reads its switch at a different moment, so both kinds are set:
  - environment variables, read by a library when it is first imported (tqdm reads ``TQDM_*``
    when its class is defined; huggingface_hub its constants; transformers its default verbosity
    when its logger is first configured), and passed on to any process the task starts;
  - the libraries' own calls, for those already imported: a reused Ray worker has imported
    transformers and tqdm in an earlier task, and the environment no longer reaches them.
Errors still print (verbosity ``error``); only progress bars and info/warning chatter go.
"""

from __future__ import annotations

import functools
import os
import sys

QUIET_ENVIRONMENT = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TQDM_DISABLE": "1",
}
"""Set in the task's process (os.environ) before any of these libraries is imported."""


def silence_third_party_output() -> None:
    """Turn off third-party progress bars in this process, imported libraries included; cheap
    and safe to call at the start of every task (nothing is imported that was not already)."""
    os.environ.update(QUIET_ENVIRONMENT)
    if "tqdm" in sys.modules:
        _disable_imported_tqdm()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()


def _disable_imported_tqdm() -> None:
    """What ``TQDM_DISABLE=1`` would have done had it been set before tqdm was imported: every
    bar (tqdm.auto, tqdm.rich, ... subclass this one) defaults to ``disable=True``; a caller
    that passes ``disable=`` itself still decides, as with the variable."""
    from tqdm import std

    init = vars(std.tqdm)["__init__"]
    if getattr(init, "keywords", {}).get("disable") is True:
        return  # already done in this process
    std.tqdm.__init__ = functools.partialmethod(init, disable=True)
