"""Hostile YAML through core/yamlio.py (issue 23): a file or a command-line value that is too big,
too deep, an alias bomb or not UTF-8 is refused in one sentence naming it, before anything walks it."""

from __future__ import annotations

import pytest
import yaml

from dapo_ablate.core import yamlio
from dapo_ablate.core.yamlio import MAX_FILE_BYTES, YAMLFileError, YAMLSyntaxError, load_yaml_text, read_yaml_mapping

# 9 lists of 9: 9^9 = 387M leaves once expanded, 400 bytes as text
ALIAS_BOMB = "[" + ", ".join(
    ["&a0 [x, x, x, x, x, x, x, x, x]"] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
) + "]"


def one_sentence(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_an_alias_bomb_given_as_text_is_refused_before_it_is_walked():
    with pytest.raises(YAMLFileError) as error:
        load_yaml_text(ALIAS_BOMB, "override 'seeds'")
    message = one_sentence(error)
    assert message.startswith("override 'seeds' expands to more than") and "aliases" in message


def test_plain_values_parse_as_yaml_scalars_and_lists():
    assert load_yaml_text("[0, 1]", "override 'seeds'") == [0, 1]
    assert load_yaml_text("0.3", "override 'x'") == 0.3
    assert load_yaml_text("true", "override 'x'") is True
    assert load_yaml_text("", "override 'x'") is None
    assert load_yaml_text("a: {b: 1}", "override 'x'") == {"a": {"b": 1}}


def test_text_that_is_not_yaml_is_a_syntax_error_a_caller_can_tell_apart():
    with pytest.raises(YAMLSyntaxError) as error:
        load_yaml_text("[1, 2", "override 'seeds'")
    assert "override 'seeds' is not valid YAML" in one_sentence(error)
    assert issubclass(YAMLSyntaxError, YAMLFileError)


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "- " * 5000 + "x"], ids=["flow", "block"])
@pytest.mark.parametrize("loader", ["libyaml", "pure Python"])
def test_deep_nesting_in_a_file_is_one_sentence_not_a_recursion_error(tmp_path, monkeypatch, text, loader):
    if loader == "pure Python":
        monkeypatch.setattr(yamlio, "_LOADER", yaml.SafeLoader)  # recurses: RecursionError inside PyYAML
    elif not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML was built without libyaml")
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(YAMLFileError) as error:
        read_yaml_mapping(path)
    message = one_sentence(error)
    assert message.startswith(f"config file {str(path)!r}") and "nest" in message.removeprefix(f"config file {str(path)!r}")


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("#" * (MAX_FILE_BYTES + 1))  # a comment: parses instantly, so only the size check refuses it
    with pytest.raises(YAMLFileError, match="larger than 1 MB"):
        read_yaml_mapping(path)


def test_text_over_the_size_limit_is_refused():
    with pytest.raises(YAMLFileError, match="override 'x' is larger than 1 MB"):
        load_yaml_text("#" * (MAX_FILE_BYTES + 1), "override 'x'")


def test_text_with_undecodable_command_line_bytes_is_one_sentence():
    raw = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python hands non-UTF-8 argv bytes over
    with pytest.raises(YAMLFileError) as error:
        load_yaml_text(raw, "override 'name'")
    assert "not UTF-8" in one_sentence(error)


@pytest.mark.parametrize("text, where", [
    ("name: x\nfactors: [a, b\nseeds: 1\n",
     "did not find expected ',' or ']' at line 3, column 6, while parsing a flow sequence at line 2, column 10"),
    ("name: x\n  seeds: 1\n", "at line 2, column 8"),
    ("a: 1\nb: *nope\n", "found undefined alias at line 2, column 4"),
])
def test_a_syntax_error_names_the_line_and_the_column(text, where):
    with pytest.raises(YAMLSyntaxError) as error:
        load_yaml_text(text, "spec file 'x.yaml'")
    message = one_sentence(error)
    assert message.startswith("spec file 'x.yaml' is not valid YAML (") and where in message, message


@pytest.mark.parametrize("text, where", [
    ("seeds: " + "9" * 5000, "cannot be read as an integer (exceeds the limit (4300 digits) for integer string conversion) at line 1, column 8"),
    ("name: ok\nwhen: 2024-13-01\n", "'2024-13-01' cannot be read as a date (month must be in 1..12) at line 2, column 7"),
])
def test_a_scalar_python_cannot_build_is_a_syntax_error_at_its_place(text, where):
    # int() refuses 4,301+ digits and date() a 13th month: without the guard, a ValueError traceback
    with pytest.raises(YAMLSyntaxError) as error:
        load_yaml_text(text, "spec file 'x.yaml'")
    assert where in one_sentence(error)


def test_a_date_like_override_that_is_no_date_stays_a_string_for_the_caller():
    assert load_yaml_text("2024-01-02", "override 'name'").isoformat() == "2024-01-02"
    with pytest.raises(YAMLSyntaxError):  # the override parser reads such a value as plain text
        load_yaml_text("2024-13-01", "override 'name'")
