"""The built-in family's second policy size and second task (transfer studies' model and task axes):
the comparison task's problems, held-out split and verifier; the large policy; their config rules.

Policies built here use a few warm-start steps (a separate cached checkpoint, seconds to build): the
tests check the plumbing, benchmarks/builtin_settings.py measures the fully warm-started policies.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_builtin_settings_e2e.py."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from dapo_ablate.core.comparison import (
    COMPARISON_EVAL_SEED,
    COMPARISON_SYMBOLS,
    COMPARISON_TRAIN_SEED,
    VERDICTS,
    ComparisonProblem,
    ComparisonSpec,
    generate_problems,
    solution_text,
    warmstart_example,
)
from dapo_ablate.core.config import (
    ConfigError,
    ModelConfig,
    TrainerConfig,
    build_trainer_config,
)
from dapo_ablate.core.data import BUILTIN_EVAL_SEED, BUILTIN_TRAIN_SEED
from dapo_ablate.core.policy import BuiltinRecipe, builtin_recipe, builtin_tokenizer
from dapo_ablate.core.verifier import Verifier, normalize_comparison, verify


def _problem(prompt: str) -> ComparisonProblem:
    left, right = prompt.rstrip("=").split("?")
    return ComparisonProblem(tuple(map(int, left.split("+"))), tuple(map(int, right.split("+"))))


# ------------------------------------------------------------------------- the comparison task
def test_comparison_problems_state_their_verdict_and_clean_solutions_reach_it():
    assert ComparisonProblem((7, 5), (9, 4)).prompt == "7+5?9+4="
    assert [ComparisonProblem(l, r).answer for l, r in (((7, 5), (9, 4)), ((9, 4), (7, 5)), ((6, 6), (9, 3)))] \
        == ["less", "greater", "equal"]  # 12 < 13, 13 > 12, 12 = 12
    assert solution_text(ComparisonProblem((7, 5), (9, 4)), verbose=False) == "12;13\nAnswer: less"
    assert solution_text(ComparisonProblem((7, 5, 1), (9, 4)), verbose=True) == "7+5=12,12+1=13;9+4=13\nAnswer: equal"
    # a slip (+1 on the left's first running sum) carries to the total and flips the verdict: 13 > 12
    assert solution_text(ComparisonProblem((7, 5), (8, 4)), verbose=False, slips=[1, 0]) == "13;12\nAnswer: greater"
    spec = ComparisonSpec()
    problems = generate_problems(3000, seed=5)
    for p in problems:
        assert spec.min_side_terms <= len(p.left) <= spec.max_side_terms
        assert spec.min_side_terms <= len(p.right) <= spec.max_side_terms
        assert abs(sum(p.left) - sum(p.right)) <= spec.max_gap
        assert verify(solution_text(p, verbose=True), p.answer, "comparison")
    counts = Counter(p.answer for p in problems)
    assert set(counts) == set(VERDICTS) and min(counts.values()) > 300  # every verdict is common
    assert generate_problems(50, seed=5) == problems[:50]  # seeded


def test_comparison_warmstart_traces_slip_sometimes():
    rng = random.Random(0)
    examples = [warmstart_example(rng, ComparisonSpec()) for _ in range(400)]
    wrong = sum(not verify(solution, _problem(prompt).answer, "comparison") for prompt, solution in examples)
    assert 0.05 * 400 < wrong < 0.5 * 400  # an error mode for RL, not noise


def test_comparison_held_out_set_has_its_own_seed_and_is_disjoint_from_training():
    from dapo_ablate.core.trainer import load_task

    assert len({COMPARISON_TRAIN_SEED, COMPARISON_EVAL_SEED, BUILTIN_TRAIN_SEED, BUILTIN_EVAL_SEED}) == 4
    task = load_task(TrainerConfig(data={"builtin_task": "comparison", "builtin_train_size": 5000}))
    held_out = {p for p, _ in task.held_out}
    assert len(task.held_out) == 64 and all("?" in p for p in held_out)
    assert [p for p, _ in task.held_out] == [p.prompt for p in generate_problems(64, COMPARISON_EVAL_SEED)]
    assert not held_out & {p for p, _ in task.train}
    assert task.decontaminated > 0  # small digits repeat: the held-out prompts were drawn, then removed
    assert len(task.train) == 5000 - task.decontaminated
    assert {a for _, a in task.train} == set(VERDICTS)


# ----------------------------------------------------------------------- its verifier path
@pytest.mark.parametrize(("response", "gold", "correct"), [
    ("12;13\nAnswer: less", "less", True),
    ("7+5=12;9+4=13\nAnswer: less", "less", True),
    ("12;12\nAnswer: equal", "equal", True),
    ("Answer: Greater.", "greater", True),        # case and a full stop
    ("**Answer:** greater", "greater", True),     # markdown bold
    ("the sums are 13 and 12, so $\\boxed{>}$", "greater", True),  # a symbol in the boxed fallback
    ("Answer: =", "equal", True),                 # `=` is a comparison here, not an empty right-hand side
    ("Answer: \\text{less}", "less", True),
    ("12;13\nAnswer: greater", "less", False),    # the wrong word
    ("12;13\nAnswer: less than", "less", False),  # malformed: more than the word
    ("12;13\nAnswer: 13", "less", False),         # a number, not a comparison
    ("12;13\nAnswer: <=", "less", False),
    ("12;13\nAnswer: lesser", "less", False),
    ("12;13\nless", "less", False),               # no answer line
    ("12;13\nAnswer:", "less", False),            # an empty answer line
    ("", "equal", False),
    ("Answer: less", "13", False),                # a gold that is not a comparison matches nothing
])
def test_comparison_verifier_accepts_the_word_and_rejects_the_rest(response, gold, correct):
    assert verify(response, gold, method="comparison") is correct


def test_comparison_normalisation_and_batch_grading():
    assert [normalize_comparison(s) for s in ("less", " LESS ", "<", "\\lt", "$>$", "\\boxed{equal}", "eq", "1")] \
        == ["less", "less", "less", "less", "greater", "equal", None, None]
    grade = Verifier("comparison")
    assert grade(["Answer: less", "Answer: more", None], ["less", "greater", "equal"]) == [True, False, False]
    # DAPO's answer line alone would read `=` as an empty answer and could never grade `equal`
    assert not verify("Answer: =", "equal", method="answer_line")


def test_auto_verifier_means_comparison_on_the_comparison_task_only():
    assert TrainerConfig(data={"builtin_task": "comparison"}).verifier_method == "comparison"
    assert TrainerConfig(data={"builtin_task": "comparison", "verifier": "comparison"}).verifier_method == "comparison"
    assert TrainerConfig().verifier_method == "auto"


# ----------------------------------------------------------------------------- the policies
def test_the_default_recipe_is_unchanged_so_existing_caches_stay_valid():
    assert builtin_recipe(ModelConfig()) == BuiltinRecipe()
    assert builtin_recipe(ModelConfig(), "addition").digest() == BuiltinRecipe().digest()
    digests = {builtin_recipe(ModelConfig(builtin_size=s), t).digest()
               for s in ("small", "large") for t in ("addition", "comparison")}
    assert len(digests) == 4  # every size x task is its own checkpoint


def test_an_altered_shipped_policy_is_not_used_but_built(tmp_path, monkeypatch):
    """One flipped byte in a shipped weight file: the package's folder is refused (with a warning),
    and the policy is built into the cache like any other recipe."""
    import shutil

    from dapo_ablate.core import policy as policy_module

    recipe = builtin_recipe(ModelConfig())
    shipped = policy_module.SHIPPED_ROOT / f"builtin-{recipe.digest()}"
    copy = tmp_path / "shipped"
    shutil.copytree(shipped, copy / shipped.name)
    weights = bytearray((copy / shipped.name / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (copy / shipped.name / "model.safetensors").write_bytes(bytes(weights))
    monkeypatch.setattr(policy_module, "SHIPPED_ROOT", copy)
    with pytest.warns(UserWarning, match="does not match its digests"):
        assert policy_module.shipped_checkpoint(recipe) is None
    manifest = copy / shipped.name / policy_module.SHIPPED_MANIFEST  # a manifest rewritten to match is refused too
    manifest.write_text(manifest.read_text().replace(
        policy_module._sha256(shipped / "model.safetensors"), policy_module._sha256(copy / shipped.name / "model.safetensors")))
    with pytest.warns(UserWarning, match="does not match its digests"):
        assert policy_module.shipped_checkpoint(recipe) is None
    assert policy_module.shipped_checkpoint(builtin_recipe(ModelConfig(builtin_size="large"))) is None  # not shipped


def test_comparison_tokens_are_appended_so_addition_ids_never_move():
    addition, extended = builtin_tokenizer(), builtin_tokenizer(COMPARISON_SYMBOLS)
    assert extended.get_vocab() | addition.get_vocab() == extended.get_vocab()  # a superset, same ids
    ids = extended("7+5?9+4=12;13\nAnswer: less", add_special_tokens=False)["input_ids"]
    assert len(ids) == len("7+5?9+4=12;13\n") + 3  # `Answer:`, the space and `less` are one token each
    assert extended.decode(ids) == "7+5?9+4=12;13\nAnswer: less"
    assert addition.unk_token_id in addition("3?4=", add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------- config errors
@pytest.mark.parametrize(("overrides", "words"), [
    ({"model": {"builtin_size": "huge"}}, "builtin_size"),
    ({"model": {"builtin_size": "large", "path": "."}}, "model.builtin_size large sizes the built-in policy only"),
    ({"data": {"builtin_task": "fractions"}}, "builtin_task"),
    ({"data": {"builtin_task": "comparison", "builtin_max_terms": 3}}, "addition task's mix"),
    ({"data": {"verifier": "comparison"}}, "the built-in addition task's answers are numbers"),
    ({"data": {"builtin_task": "comparison", "verifier": "answer_line"}},
     "data.verifier answer_line cannot grade the comparison task's word answers"),
])
def test_bad_builtin_choices_are_one_sentence_naming_the_field(overrides, words):
    with pytest.raises(ConfigError) as err:
        build_trainer_config(overrides)
    message = str(err.value)
    assert words in message and "\n" not in message and message.count(". ") == 0


def test_comparison_with_only_files_is_refused(tmp_path):
    for name in ("train.jsonl", "eval.jsonl"):
        (tmp_path / name).write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(ConfigError, match="builtin_task comparison applies to built-in problems only"):
        build_trainer_config({"data": {"builtin_task": "comparison", "train": str(tmp_path / "train.jsonl"),
                                       "eval": str(tmp_path / "eval.jsonl")}})
