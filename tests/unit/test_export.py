"""Table exporters (reports/export.py): Markdown, LaTeX and HTML from pandas' writers, compared
with outputs written out by hand for small frames; number formats of every report table kind;
escaping of LaTeX specials, HTML and Markdown pipes."""

from __future__ import annotations

import math
import re
import textwrap

import pandas as pd
import pytest

from dapo_ablate.reports.export import (
    TableFiles,
    display_frame,
    latex_escape,
    to_html,
    to_latex,
    to_markdown,
    write_table,
)


NAN = math.nan


def effects_table() -> pd.DataFrame:
    """Two rows of effects.csv as the analysis stores them (fractions)."""
    return pd.DataFrame(
        {
            "term": ["overlong_filter", "clip_higher:dynamic_sampling"],
            "effect": [0.0631, -0.0071],
            "se": [0.0019, 0.0042],
            "ci_low": [0.0593, -0.0157],
            "ci_high": [0.0669, 0.0013],
            "p_value": [8.2e-41, 0.0968],
            "df": [62.0, 7.5],
            "p_adjusted": [9.9e-40, NAN],
        }
    )


def render_markdown(table: pd.DataFrame, percent: bool = True, factors=()) -> str:
    return to_markdown(table, display_frame(table, percent, list(factors)))


def test_effects_markdown():
    # column width = max(header + 2, widest cell); text left (":---"), numbers right ("---:");
    # metrics in pp with one decimal (0.0631 -> 6.3); p < 0.001 -> "<0.001"; df 62 whole, 7.5 kept;
    # a missing p_adjusted is an empty cell
    expected = textwrap.dedent("""\
        | term                         |   effect (pp) |   se (pp) |   ci_low (pp) |   ci_high (pp) |   p_value |   df |   p_adjusted |
        |:-----------------------------|--------------:|----------:|--------------:|---------------:|----------:|-----:|-------------:|
        | overlong_filter              |           6.3 |       0.2 |           5.9 |            6.7 |    <0.001 |   62 |       <0.001 |
        | clip_higher:dynamic_sampling |          -0.7 |       0.4 |          -1.6 |            0.1 |     0.097 |  7.5 |              |
        """)
    assert render_markdown(effects_table()) == expected


def test_effects_latex_is_a_booktabs_float_with_caption_and_label():
    table = effects_table()
    caption = "Main effects & interactions in pp; 95% CIs; p_adjusted by Holm"
    expected = textwrap.dedent(r"""        \begin{table}[ht]
        \centering
        \caption{Main effects \& interactions in pp; 95\% CIs; p\_adjusted by Holm}
        \label{tab:effects}
        \begin{tabular}{lrrrrrrr}
        \toprule
        term & effect (pp) & se (pp) & ci\_low (pp) & ci\_high (pp) & p\_value & df & p\_adjusted \\
        \midrule
        overlong\_filter & 6.3 & 0.2 & 5.9 & 6.7 & \textless{}0.001 & 62 & \textless{}0.001 \\
        clip\_higher:dynamic\_sampling & -0.7 & 0.4 & -1.6 & 0.1 & 0.097 & 7.5 &  \\
        \bottomrule
        \end{tabular}
        \end{table}
        """)
    shown = display_frame(table, True, [])
    assert to_latex(table, shown, caption, label="tab:effects") == expected
    assert r"\label" not in to_latex(table, shown, caption)  # no label asked for, none written


def test_effects_html_escapes_and_marks_numbers():
    table = effects_table()[["term", "effect", "p_value"]]
    table.loc[1, "term"] = 'a<b & "c"'
    expected = textwrap.dedent("""\
        <style type="text/css">
        </style>
        <table id="T_{id}">
          <thead>
            <tr>
              <th class="col_heading level0 col0" >term</th>
              <th class="col_heading level0 col1" >effect (pp)</th>
              <th class="col_heading level0 col2" >p_value</th>
            </tr>
          </thead>
          <tbody>
            <tr>
              <td class="data row0 col0" >overlong_filter</td>
              <td class="data row0 col1 num" >6.3</td>
              <td class="data row0 col2 num" >&lt;0.001</td>
            </tr>
            <tr>
              <td class="data row1 col0" >a&lt;b &amp; &#34;c&#34;</td>
              <td class="data row1 col1 num" >-0.7</td>
              <td class="data row1 col2 num" >0.097</td>
            </tr>
          </tbody>
        </table>
        """)
    text = to_html(table, display_frame(table, True, []))
    table_id = re.search(r'<table id="T_([0-9a-f]{10})">', text).group(1)
    assert text == expected.replace("{id}", table_id)


def test_html_ids_are_stable_and_differ_between_tables():
    """Styler's default id is random: the same report would give a different page every time."""
    table = effects_table()
    shown = display_frame(table, True, [])
    other = display_frame(table.iloc[:1], True, [])
    pairs = [(table, shown), (table, shown), (table.iloc[:1], other)]
    ids = [re.search(r'<table id="([^"]+)"', to_html(t, s)).group(1) for t, s in pairs]
    assert ids[0] == ids[1] != ids[2]


def test_cumulative_with_the_papers_numbers():
    # step and paper are counts (whole); the baseline row has no delta
    cumulative = pd.DataFrame(
        {
            "ordering": ["paper", "paper"],
            "step": [0, 1],
            "added": ["baseline", "overlong_filter"],
            "mean": [0.2998, 0.3652],
            "paper": [30, 36],
            "delta": [NAN, 0.0654],
        }
    )
    expected = textwrap.dedent("""\
        | ordering   |   step | added           |   mean (pp) |   paper (pp) |   delta (pp) |
        |:-----------|-------:|:----------------|------------:|-------------:|-------------:|
        | paper      |      0 | baseline        |        30.0 |           30 |              |
        | paper      |      1 | overlong_filter |        36.5 |           36 |          6.5 |
        """)
    assert render_markdown(cumulative) == expected


def test_orderings_positions_and_shares():
    # position is a number although stored as text in some designs; share_positive a whole percent
    orderings = pd.DataFrame(
        {
            "factor": ["clip_higher", "clip_higher"],
            "position": ["1", "2-4"],
            "n_orderings": [24, 72],
            "mean": [-0.0061, 0.0032],
            "share_positive": [0.125, 0.6667],
        }
    )
    expected = textwrap.dedent("""\
        | factor      |   position |   n_orderings |   mean (pp) |   share_positive |
        |:------------|-----------:|--------------:|------------:|-----------------:|
        | clip_higher |          1 |            24 |        -0.6 |              12% |
        | clip_higher |        2-4 |            72 |         0.3 |              67% |
        """)
    assert render_markdown(orderings) == expected


def test_compute_tokens_ratios_and_seconds():
    compute = pd.DataFrame(
        {
            "cell": ["GRPO", "OF+DS"],
            "overlong_filter": [0, 1],
            "n": [3, 3],
            "tokens_generated": [10_000_000.0, 12_345_678.0],
            "discarded_share": [0.0, 0.1],
            "wall_s": [500.4, 612.6],
            "tokens_vs_baseline": [1.0, 1.2345678],
            "gain_per_added_mtok": [NAN, 0.059],
        }
    )
    expected = textwrap.dedent("""\
        | cell   |   overlong_filter |   n |   tokens_generated |   discarded_share |   wall_s |   tokens_vs_baseline |   gain_per_added_mtok (pp) |
        |:-------|------------------:|----:|-------------------:|------------------:|---------:|---------------------:|---------------------------:|
        | GRPO   |                 0 |   3 |             10.00M |                0% |      500 |                1.00x |                            |
        | OF+DS  |                 1 |   3 |             12.35M |               10% |      613 |                1.23x |                        5.9 |
        """)
    assert render_markdown(compute, factors=["overlong_filter"]) == expected


def test_cells_as_fractions_when_the_metric_is_not_a_fraction():
    # percent=False (e.g. a response-length metric): 4 significant digits, no scaling
    cells = pd.DataFrame({"cell": ["GRPO", "OF"], "mean": [0.2997694, 1234.567], "sd": [0.004621, 12.0]})
    expected = textwrap.dedent("""\
        | cell   |   mean |       sd |
        |:-------|-------:|---------:|
        | GRPO   | 0.2998 | 0.004621 |
        | OF     |   1235 |       12 |
        """)
    assert render_markdown(cells, percent=False) == expected


def test_transfer_table_unknown_columns_fall_back_to_four_digits():
    # p_interaction reads as a p-value (3 decimals); i2, a column of no known kind, falls back
    transfer = pd.DataFrame(
        {
            "term": ["overlong_filter"],
            "setting": ["qwen-7b"],
            "estimate": [0.0638],
            "p_interaction": [0.90351],
            "i2": [0.0],
            "verdict": ["transfers"],
        }
    )
    expected = textwrap.dedent("""\
        | term            | setting   |   estimate (pp) |   p_interaction |   i2 | verdict   |
        |:----------------|:----------|----------------:|----------------:|-----:|:----------|
        | overlong_filter | qwen-7b   |             6.4 |           0.904 |    0 | transfers |
        """)
    assert render_markdown(transfer) == expected


def test_markdown_keeps_formatted_numbers_and_escapes_pipes():
    # tabulate would re-parse "36.0" as 36 and "1.0e-05"-like text as numbers; cells are final
    table = pd.DataFrame({"cell": ["a|b"], "mean": [0.36]})
    assert render_markdown(table).splitlines()[2] == r"| a\|b   |        36.0 |"


def test_latex_escapes_specials_in_names_headers_and_caption():
    table = pd.DataFrame({"lr_50%&x": [1], "cell": ["a#b$c{d}~e^f\\g<h>"]})
    text = to_latex(table, display_frame(table, True, ["lr_50%&x"]), "50% of {cells} & more_")
    assert r"\caption{50\% of \{cells\} \& more\_}" in text
    assert r"lr\_50\%\&x & cell \\" in text
    assert (
        r"1 & a\#b\$c\{d\}\textasciitilde{}e\textasciicircum{}f\textbackslash{}g\textless{}h\textgreater{} \\"
        in text
    )
    # compiles-looking: one tabular, booktabs rules in order, every environment closed
    rules = [line for line in text.splitlines() if line in (r"\toprule", r"\midrule", r"\bottomrule")]
    assert rules == [r"\toprule", r"\midrule", r"\bottomrule"]
    for environment in ("table", "tabular"):
        assert text.count(rf"\begin{{{environment}}}") == text.count(rf"\end{{{environment}}}") == 1
    assert latex_escape("a_b & 50%") == r"a\_b \& 50\%"


def test_html_escapes_headers():
    table = pd.DataFrame({"<script>": ["x"]})
    text = to_html(table, display_frame(table, True, []))
    assert "&lt;script&gt;" in text and "<script>" not in text


def test_write_table_files(tmp_path):
    table = effects_table()
    files = TableFiles(tmp_path, frozenset({"csv", "md", "tex"}), percent=True, factors=())
    written = write_table("effects", table, files, "Effects_x.")
    assert sorted(written) == ["effects.csv", "effects.md", "effects.tex"]
    pd.testing.assert_frame_equal(pd.read_csv(written["effects.csv"]), table)  # stored as computed
    markdown = written["effects.md"].read_text()
    assert markdown == "Effects_x.\n\n" + render_markdown(table)
    latex = written["effects.tex"].read_text()
    assert r"\caption{Effects\_x.}" in latex and r"\label{tab:effects}" in latex


def test_write_table_display_adds_columns_to_md_only(tmp_path):
    table = pd.DataFrame({"step": [0], "mean": [0.30]})
    display = table.assign(paper=[30])
    written = write_table("cumulative", table, TableFiles(tmp_path, frozenset({"csv", "md"}), True, ()), "c", display)
    assert list(pd.read_csv(written["cumulative.csv"]).columns) == ["step", "mean"]
    assert "|   paper (pp) |" in written["cumulative.md"].read_text()


@pytest.mark.parametrize("writer", ["md", "tex", "html"])
def test_an_empty_table_keeps_its_header(writer):
    table = pd.DataFrame({"term": pd.Series([], dtype=object), "effect": pd.Series([], dtype=float)})
    shown = display_frame(table, True, [])
    assert list(shown.columns) == ["term", "effect (pp)"]  # the unit in the header
    writers = {
        "md": lambda: to_markdown(table, shown),
        "tex": lambda: to_latex(table, shown, "c"),
        "html": lambda: to_html(table, shown),
    }
    text = writers[writer]()
    assert "term" in text and "effect" in text
