"""Hostile YAML through core/yamlio.py: a file or a command-line value that is too big,
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


def test_an_integer_past_pythons_digit_limit_is_a_syntax_error_at_its_place():
    # int() refuses 4,301 digits and more: without the guard, a ValueError traceback
    with pytest.raises(YAMLSyntaxError) as error:
        load_yaml_text("name: ok\nseeds: " + "9" * 5000, "spec file 'x.yaml'")
    assert "cannot be read as an integer (exceeds the limit (4300 digits) for integer string conversion) at line 2, column 8" in one_sentence(error)


@pytest.mark.parametrize("tag", ["!!binary aGVsbG8=", "!!set {a, b}", "!!omap [a: 1]", "!!pairs [a: 1]"])
def test_tags_beyond_plain_data_are_refused_at_their_place(tag):
    # bytes, sets and pairs are no JSON: a config copied through json.dumps would raise TypeError
    with pytest.raises(YAMLSyntaxError) as error:
        load_yaml_text(f"name: ok\ntrainer: {tag}\n", "spec file 'x.yaml'")
    assert f"{tag.split()[0]} is not plain data" in one_sentence(error) and "at line 2, column 10" in str(error.value)


def test_dates_and_times_stay_the_text_they_were():
    assert load_yaml_text("a: 2024-01-02\nb: 2024-13-01\nc: !!timestamp 2001-12-14t21:59:43.10-05:00", "x") == {
        "a": "2024-01-02", "b": "2024-13-01", "c": "2001-12-14t21:59:43.10-05:00"}


@pytest.mark.parametrize("number", [str(2**63), str(-(2**63) - 1), "1" + "0" * 400, "0x" + "f" * 17])
def test_an_integer_past_64_bits_is_refused_by_its_key(number):
    # no setting takes one; 10^400 crashed validate's time estimate (int too large to convert to float)
    with pytest.raises(YAMLFileError) as error:
        load_yaml_text(f"name: ok\ntrainer: {{schedule: {{total_steps: {number}}}}}\n", "spec file 'x.yaml'")
    message = one_sentence(error)
    assert message.startswith("spec file 'x.yaml': `trainer.schedule.total_steps` is ") and "outside the 64-bit" in message
    assert not isinstance(error.value, YAMLSyntaxError)  # an override's value is not read as text instead
    with pytest.raises(YAMLFileError, match=r"^override 'seeds': `\[1\]` is 18446744073709551616, outside"):
        load_yaml_text(f"[0, {2**64}]", "override 'seeds'")
    assert load_yaml_text(f"a: {2**63 - 1}\nb: {-(2**63)}", "x") == {"a": 2**63 - 1, "b": -(2**63)}


def test_a_path_that_is_no_yaml_file_is_named_with_the_shared_reason(tmp_path):
    """Why a path is no file reads as core/config_errors words it (for the data files and the
    results CSV too), the path whole and escaped on one line."""
    import os

    fifo = tmp_path / "spec\n.yaml"
    os.mkfifo(fifo)
    with pytest.raises(YAMLFileError) as error:  # refused by its kind, never opened (it would block)
        read_yaml_mapping(fifo, kind="spec file")
    assert one_sentence(error) == (f"spec file {str(fifo)!r} is not a regular file (a pipe, socket or device); "
                                   "give the path of a YAML file")  # fmt: skip
    os.symlink(tmp_path / "gone.yaml", tmp_path / "link.yaml")
    with pytest.raises(YAMLFileError) as error:
        read_yaml_mapping(tmp_path / "link.yaml")
    assert one_sentence(error).endswith(f"is a link to {str(tmp_path / 'gone.yaml')!r}, which does not exist; check the path")
    with pytest.raises(YAMLFileError) as error:
        read_yaml_mapping(tmp_path / ("x" * 300 + ".yaml"))
    assert one_sentence(error).endswith("cannot be read (File name too long); check the path")


def test_an_integer_past_64_bits_is_named_by_its_digits():
    with pytest.raises(YAMLFileError) as error:
        load_yaml_text("seeds: " + "9" * 40, "override 'seeds'")
    assert one_sentence(error).startswith("override 'seeds': `seeds` is an integer of 40 digits, outside the 64-bit integers")
