"""Verifier: extraction, normalisation, exact and math-verify matching, and its bounds.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_verifier_e2e.py."""

import os
import random
import threading

import pytest

from dapo_ablate.core.verifier import (
    TAIL_CHARS,
    Verifier,
    extract_answer,
    normalize_answer,
    verify,
)

# Adversarial checks run with a short bound; a hang would stall the test run, not fail a timer.
# Checks that must succeed keep the default 2 s, which a loaded machine still meets.
BOUND_S = 0.5

ADVERSARIAL = [
    "Answer: 9^{9^{9^{9}}}",  # sympy would evaluate this for minutes
    "Answer: 9^9^9^9",
    "\\frac{" * 10_000,
    "Answer: " + "\\frac{" * 600,
    "Answer: " + "{" * 3_000,
    "\\boxed{" + "{" * 3_000,
    "Answer: " + "\\boxed{" * 500 + "}" * 500,
    "Answer: " + "\\text{" * 500 + "}" * 500,
    "x" * (1 << 20),
    "Answer: " + "1" * (1 << 20),
    "Answer: \\sqrt{\\sqrt{\\sqrt{" * 300,
    "\x00\udc80\ufffd Answer: \x00",
]


def test_extract_answer_line():
    assert extract_answer("Let me think.\nAnswer: 42") == "42"
    assert extract_answer("Answer: 42   \n") == "42"
    assert extract_answer("  Answer:7") == "7"


def test_last_of_several_answer_lines_wins():
    assert extract_answer("Answer: 1\nwait, no.\nAnswer: 2\nthe end") == "2"


def test_markdown_bold_is_tolerated():
    assert extract_answer("**Answer:** 42") == "42"
    assert extract_answer("**Answer: 42**") == "42"
    assert extract_answer("**Answer**: 42") == "42"


def test_answer_must_start_a_line_and_is_case_sensitive():
    assert extract_answer("the Answer: 5 is wrong") is None
    assert extract_answer("answer: 5") is None


def test_empty_answer_line_falls_back_to_previous():
    assert extract_answer("Answer: 3\nAnswer:\n") == "3"


def test_boxed_fallback_takes_last_balanced_box():
    assert extract_answer(r"so \boxed{1} or rather \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_answer(r"\boxed{\frac{1}{2}") is None  # unbalanced
    assert extract_answer("no answer here") is None


def test_answer_line_beats_boxed():
    assert extract_answer("\\boxed{3}\nAnswer: 4") == "4"


def test_only_the_tail_is_read():
    long = "Answer: 1\n" + "x" * (TAIL_CHARS + 10) + "\nAnswer: 2"
    assert extract_answer(long) == "2"
    assert extract_answer("Answer: 1\n" + "x" * (TAIL_CHARS + 10)) is None
    # A line cut by the window must not pose as a line start.
    cut = "y" * 10 + "Answer: 9" + "z" * (TAIL_CHARS - len("Answer: 9"))
    assert extract_answer(cut) is None


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("$42$", "42"),
        (" 42. ", "42"),
        ("1,000", "1000"),
        ("1,234,567.5", "1234567.5"),
        ("+7", "7"),
        ("42.0", "42"),
        ("-3.00", "-3"),
        ("-0", "0"),
        ("30^\\circ", "30"),
        ("30^{\\circ}", "30"),
        ("30 degrees", "30"),
        ("\\text{5 cm}", "5"),
        ("\\textbf{12}", "12"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac{1}{2}", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("10\\!000", "10000"),
        ("1{,}000", "1000"),
        ("50\\%", "50"),
        ("x = 3", "3"),
        ("\\boxed{17}", "17"),
        ("\\boxed{\\boxed{ 17 }}", "17"),
        ("\\text{\\textbf{7}}", "7"),
        ("++3", "3"),
        ("0.50", "0.5"),
        ("-1.250", "-1.25"),
        (".50", ".5"),
        ("\\boxed{1}+\\boxed{2}", "\\boxed{1}+\\boxed{2}"),
        ("x\\rightarrow3", "x\\rightarrow3"),
        ("a + b", "a+b"),  # DAPO's "a " substitution would have eaten the a
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected
    assert normalize_answer(expected) == expected  # idempotent


def test_exact_match():
    assert verify("Answer: 42", "42")
    assert verify("Answer: 42", 42)  # int ground truths are compared as strings
    assert verify("Answer: $1,000$ dollars", "1000", method="answer_line")
    assert not verify("Answer: 43", "42")
    assert not verify("no answer line", "42")


def test_plain_numbers_compare_as_fractions_in_auto_only():
    assert verify("Answer: .5", "0.5")
    assert not verify("Answer: .5", "0.5", method="answer_line")
    assert verify("Answer: 0.50", "0.5", method="answer_line")  # trailing zeros are normalised


def test_math_verify_equivalence():
    assert verify("Answer: \\frac{1}{2}", "0.5", method="math_verify")
    assert verify("Answer: \\frac{1}{2}", "0.5")  # auto falls back to math-verify
    assert not verify("Answer: \\frac{1}{2}", "0.5", method="answer_line")
    assert verify("Answer: \\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", method="math_verify")
    assert not verify("Answer: \\frac{1}{3}", "0.5", method="math_verify")


def test_math_verify_without_answer_line_reads_the_tail():
    assert verify("so the result is $\\frac{1}{2}$", "0.5", method="math_verify")


def test_unknown_method_is_a_value_error():
    with pytest.raises(ValueError, match="answer_line"):
        verify("Answer: 1", "1", method="exact")
    with pytest.raises(ValueError):
        Verifier(method="exact")


def test_random_bytes_never_raise():
    rng = random.Random(0)
    for _ in range(20):
        junk = os.urandom(rng.randrange(1, 5000)).decode("utf-8", errors="surrogateescape")
        for method in ("auto", "answer_line", "math_verify"):
            response = junk + "\nAnswer: " + junk[:50]
            assert verify(response, "17", method=method, timeout_s=BOUND_S) in (True, False)


def test_garbage_ground_truth_never_raises():
    assert verify("Answer: 1", "\\frac{" * 10_000, timeout_s=BOUND_S) is False
    assert verify("Answer: 1", "9^{9^{9^{9}}}", timeout_s=BOUND_S) is False
    assert verify("Answer: 1", "1" * 5_000, timeout_s=BOUND_S) is False  # past int()'s digit limit
    assert verify("Answer: " + "7" * 3_000, "7" * 3_000)


def test_verify_from_a_thread():
    results = []
    thread = threading.Thread(
        target=lambda: results.extend(
            [
                verify("Answer: \\frac{1}{2}", "0.5", method="math_verify"),
                verify("Answer: 9^{9^{9^{9}}}", "1", method="math_verify", timeout_s=BOUND_S),
            ]
        )
    )
    thread.start()
    thread.join()
    assert results == [True, False]


def test_verifier_fast_path_does_not_touch_the_worker_pool(monkeypatch):
    import dapo_ablate.core.verifier as verifier_module

    def no_pool():
        raise AssertionError("the exact-match path must not reach math-verify")

    monkeypatch.setattr(verifier_module, "_get_pool", no_pool)
    verifier = Verifier()
    assert verifier(["Answer: 42", "Answer: 7", "Answer: 0.5", "nothing"], ["42", "8", ".5", "1"]) == [
        True, False, True, False,
    ]
    assert Verifier(method="answer_line")(["Answer: \\frac{1}{2}"], ["0.5"]) == [False]


def test_verifier_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="one answer per response"):
        Verifier()(["Answer: 1"], [])
