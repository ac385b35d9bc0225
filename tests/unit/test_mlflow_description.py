"""The MLflow parent's description is Markdown that MLflow renders (its sanitizer lets `<img src>`
through): every name the product writes into it is escaped, so a name holding backticks, HTML or
Markdown stays literal text."""

from __future__ import annotations

from markdown_it import MarkdownIt

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import build_spec
from dapo_ablate.ablation.runtime.mlflow_runs import parent_note
from dapo_ablate.ablation.store.tracking import markdown_code, markdown_text

from support import spec_data

HOSTILE = "x` <img src=x onerror=alert(1)> `y"


def rendered(spec) -> str:
    return MarkdownIt("commonmark").render(parent_note(spec, expand(spec)))


def test_a_name_with_backticks_and_html_stays_inside_the_descriptions_code_span(tmp_path):
    html = rendered(build_spec(spec_data(tmp_path, HOSTILE)))
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert html.count("<code>") == 1  # the whole name, one span


def test_escaped_text_and_code_render_as_the_literal_text():
    for text in (HOSTILE, "a <img src=x> *b* [c](javascript:x) _d_ ``e``", "`", "``"):
        paragraph = MarkdownIt("commonmark").render(f"{markdown_text(text)} and {markdown_code(text)}")
        assert "<img" not in paragraph and "<em>" not in paragraph and "<a " not in paragraph, paragraph
        assert paragraph.count("<code>") == 1, paragraph
