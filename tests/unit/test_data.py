"""Problem loaders: JSONL, JSON, verl parquet, held-out eval sets, and their errors."""

import json
import logging

import pandas as pd
import pytest

from dapo_ablate.core.data import DataError, Problem, load_eval_set, load_problems


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_verl_parquet(path, rows):
    """DAPO-Math-17k's schema: chat prompt, reward_model.ground_truth, data_source, extra_info."""
    frame = pd.DataFrame(
        {
            "data_source": ["math_dapo"] * len(rows),
            "prompt": [[{"role": "user", "content": question}] for question, _, _ in rows],
            "ability": ["MATH"] * len(rows),
            "reward_model": [{"ground_truth": answer, "style": "rule"} for _, answer, _ in rows],
            "extra_info": [{"index": index} for _, _, index in rows],
        }
    )
    frame.to_parquet(path)
    return path


def test_jsonl_with_prompt_problem_or_question_keys(tmp_path):
    path = write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"prompt": "1+1?", "answer": 2},
            {"problem": "2+2?", "answer": "4"},
            {"question": "3+3?", "answer": "6", "id": "q3"},
        ],
    )
    assert load_problems(path) == [
        Problem("1+1?", "2", "train:1"),
        Problem("2+2?", "4", "train:2"),
        Problem("3+3?", "6", "q3"),
    ]


def test_jsonl_skips_blank_lines_and_honours_limit(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "a", "answer": 1}\n\n{"prompt": "b", "answer": 2}\n'
                    '{"prompt": "c", "answer": 3}\n')
    assert [p.id for p in load_problems(path, limit=2)] == ["t:1", "t:3"]


def test_aime_style_capitalised_keys(tmp_path):
    path = write_jsonl(tmp_path / "aime.jsonl", [{"ID": "2024-I-1", "Problem": "Find x.", "Answer": 204}])
    assert load_problems(path) == [Problem("Find x.", "204", "2024-I-1")]


def test_explicit_keys_and_float_answers(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "q", "target": 34.0, "meta": {"gt": "5"}}])
    assert load_problems(path, prompt_key="text", answer_key="target")[0].answer == "34"
    assert load_problems(path, prompt_key="text", answer_key="meta.gt")[0].answer == "5"


def test_json_list(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"problem": "q1", "answer": "1/2"}, {"problem": "q2", "answer": 7}]))
    assert load_problems(path) == [Problem("q1", "1/2", "t:0"), Problem("q2", "7", "t:1")]


def test_verl_parquet(tmp_path):
    path = write_verl_parquet(tmp_path / "dapo.parquet", [("What is 17*2?", "34", "a1"), ("1+1?", "2", "a2")])
    problems = load_problems(path)
    assert problems == [
        Problem([{"role": "user", "content": "What is 17*2?"}], "34", "a1"),
        Problem([{"role": "user", "content": "1+1?"}], "2", "a2"),
    ]
    assert isinstance(problems[0].prompt, list) and isinstance(problems[0].prompt[0], dict)


def test_parquet_dedupes_exact_duplicates_by_default(tmp_path):
    rows = [("q1", "34", "a"), ("q1", "34", "b"), ("q2", "5", "c"), ("q1", "35", "d"), ("q2", "5", "e")]
    path = write_verl_parquet(tmp_path / "dapo.parquet", rows)
    assert [(p.prompt[0]["content"], p.answer, p.id) for p in load_problems(path)] == [
        ("q1", "34", "a"), ("q2", "5", "c"), ("q1", "35", "d"),  # the first of each pair is kept
    ]
    assert len(load_problems(path, dedupe=False)) == 5
    assert [p.id for p in load_problems(path, limit=2)] == ["a", "c"]  # limit counts unique problems


def test_pandas_numpy_chat_prompt_is_converted(tmp_path):
    # pandas reads a verl prompt column as a numpy array of dicts; records built from it still load.
    path = write_verl_parquet(tmp_path / "dapo.parquet", [("q", "1", "x")])
    record = pd.read_parquet(path).iloc[0].to_dict()
    assert type(record["prompt"]).__name__ == "ndarray"
    json_path = tmp_path / "t.json"
    json_path.write_text(json.dumps([{"prompt": record["prompt"].tolist(), "answer": "1"}]))
    assert load_problems(json_path)[0].prompt == [{"role": "user", "content": "q"}]


def assert_data_error(path, match, **kwargs):
    with pytest.raises(DataError, match=match) as error:
        load_problems(path, **kwargs)
    assert str(path) in str(error.value)
    assert isinstance(error.value, ValueError)


def test_missing_file(tmp_path):
    assert_data_error(tmp_path / "nope.jsonl", "no such file")


def test_unknown_suffix(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("prompt,answer\n")
    assert_data_error(path, r"unknown file type '\.csv'.*\.jsonl")


def test_missing_prompt_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "answer": 1}, {"query": "b", "answer": 2}])
    assert_data_error(path, "line 2 has no prompt.*prompt_key")


def test_missing_answer_names_the_row(tmp_path):
    frame = pd.DataFrame({"prompt": [[{"role": "user", "content": "q"}]], "reward_model": [{"style": "rule"}]})
    frame.to_parquet(tmp_path / "t.parquet")
    assert_data_error(tmp_path / "t.parquet", "row 0 has no answer.*answer_key")


def test_null_answer_is_missing(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "answer": None}])
    assert_data_error(path, "line 1 has no answer")


def test_malformed_chat_prompt(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": [{"role": "user"}], "answer": 1}])
    assert_data_error(path, "line 1 has an empty or malformed prompt")


def test_invalid_json_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "a", "answer": 1}\n{oops\n')
    assert_data_error(path, "line 2 is not valid JSON")


def test_json_must_be_a_list(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"prompt": "a", "answer": 1}')
    assert_data_error(path, "expected a JSON list")


@pytest.mark.parametrize("name, content", [("e.jsonl", "\n\n"), ("e.json", "[]")])
def test_empty_file(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    assert_data_error(path, "no records")


def test_empty_parquet(tmp_path):
    path = write_verl_parquet(tmp_path / "e.parquet", [("q", "1", "x")])
    pd.read_parquet(path).iloc[:0].to_parquet(path)
    assert_data_error(path, "no records")


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"not parquet at all")
    assert_data_error(path, "not a readable parquet file")


def test_eval_set_drops_problems_seen_in_training(tmp_path, caplog):
    train = load_problems(write_verl_parquet(tmp_path / "train.parquet", [("Find  x.", "1", "t1")]))
    records = [{"Problem": "Find x.", "Answer": 1}, {"Problem": "Find y.", "Answer": 2}]
    path = write_jsonl(tmp_path / "aime.jsonl", records)
    with caplog.at_level(logging.WARNING):
        held_out = load_eval_set(path, exclude=train)
    assert held_out == [Problem("Find y.", "2", "aime:2")]
    assert "dropped 1 of 2" in caplog.text
    assert len(load_eval_set(path)) == 2


def test_eval_set_fully_contaminated_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "aime.jsonl", [{"problem": "q", "answer": 1}])
    with pytest.raises(DataError, match="held-out"):
        load_eval_set(path, exclude=[Problem("q", "1", "t")])


# --- decontamination and prompt templates --------------------------------------------------------
def test_builtin_held_out_set_is_disjoint_from_training_by_construction():
    from dapo_ablate.core.config import TrainerConfig
    from dapo_ablate.core.data import problem_key
    from dapo_ablate.core.tasks import generate_problems
    from dapo_ablate.core.trainer import BUILTIN_EVAL_SEED, BUILTIN_TRAIN_SEED, load_task

    raw_eval = {problem_key(p.prompt) for p in generate_problems(64, BUILTIN_EVAL_SEED)}
    raw_train = [problem_key(p.prompt) for p in generate_problems(20000, BUILTIN_TRAIN_SEED)]
    assert len(raw_eval & set(raw_train)) > 0  # the two seeded streams do share problems
    task = load_task(TrainerConfig())
    held = {problem_key(p) for p, _ in task.held_out}
    assert len(task.held_out) == 64 and held == raw_eval  # the held-out set stays whole
    assert not held & {problem_key(p) for p, _ in task.train}  # overlap 0
    assert task.decontaminated == sum(k in raw_eval for k in raw_train) > 0


def test_a_user_training_file_sharing_eval_problems_is_decontaminated(tmp_path, caplog):
    from dapo_ablate.core.config import TrainerConfig
    from dapo_ablate.core.data import DAPO_INSTRUCTION, DAPO_REMINDER, problem_key
    from dapo_ablate.core.trainer import load_task

    aime = [{"problem": f"Find the value of x_{i} given  that  x = {i}.", "answer": i} for i in range(5)]
    write_jsonl(tmp_path / "aime.jsonl", aime)
    train = [{"prompt": f"Train problem {i}", "answer": i} for i in range(6)]
    train += [  # the same problems, written differently: case and spacing, DAPO's wrapper, a chat
        {"prompt": "FIND the value of x_0 given that x = 0.", "answer": 0},
        {"prompt": [{"role": "user", "content": f"{DAPO_INSTRUCTION}\n\nFind the value of x_1 given that x = 1."
                                                 f"\n\n{DAPO_REMINDER}"}], "answer": 1},
        {"prompt": "Find the value of x_2 given that x = 2.", "answer": 2},
    ]
    write_jsonl(tmp_path / "train.jsonl", train)
    config = TrainerConfig(data={"train": str(tmp_path / "train.jsonl"), "eval": str(tmp_path / "aime.jsonl")})
    task = load_task(config)
    assert task.decontaminated == 3 and len(task.train) == 6 and len(task.held_out) == 5
    assert not {problem_key(p) for p, _ in task.held_out} & {problem_key(p) for p, _ in task.train}
    # `dapo` (the default for files) asks for the final Answer: line, on train and eval prompts alike
    for prompt, _ in task.train + task.held_out:
        assert prompt[0]["role"] == "user" and prompt[0]["content"].count(DAPO_INSTRUCTION) == 1
        assert prompt[0]["content"].endswith(DAPO_REMINDER)
    # num_eval_problems truncates with a warning naming the field; unset, everything is evaluated
    with caplog.at_level("WARNING"):
        short = load_task(config.with_overrides({"data.num_eval_problems": 2}))
    assert len(short.held_out) == 2 and "data.num_eval_problems 2" in caplog.text and "of the 5" in caplog.text


def test_prompt_templates():
    from dapo_ablate.core.data import DAPO_INSTRUCTION, apply_prompt_template

    assert apply_prompt_template("1+1=", "none") == "1+1="
    assert apply_prompt_template([{"role": "user", "content": "1+1="}], "none") == "1+1="
    assert apply_prompt_template("1+1=", "chat") == [{"role": "user", "content": "1+1="}]
    wrapped = apply_prompt_template("1+1=", "dapo")
    assert wrapped[0]["content"].startswith(DAPO_INSTRUCTION) and "\n\n1+1=\n\n" in wrapped[0]["content"]
    assert apply_prompt_template(wrapped, "dapo") == wrapped  # never wrapped twice


def test_prompt_template_is_refused_for_the_builtin_task():
    from dapo_ablate.core.config import ConfigError, build_trainer_config

    with pytest.raises(ConfigError, match="data.prompt_template dapo cannot be used with the built-in task"):
        build_trainer_config({"data": {"prompt_template": "dapo"}})
