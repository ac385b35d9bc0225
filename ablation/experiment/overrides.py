"""`key=value` overrides after a config on the command line, as verl and Hydra users type them:

    dapo-ablate train examples/dapo_cpu.yaml schedule.total_steps=5 algorithm.eps_high=0.3
    dapo-ablate run examples/factorial.yaml trainer.algorithm.eps_high=0.3 executor.max_concurrent=1

Values are read as YAML scalars (`5`, `0.3`, `1e-6`, `true`, `null`, `[a, b]`). An experiment or
sweep spec is overridden by the spec's own dotted paths: each key is checked against the spec's
fields first (an unknown one gets a "did you mean"), then set in the file's data, and the result
is validated exactly like the file, so a bad value gets the file's sentence.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

from dapo_ablate.ablation.experiment.spec import SpecError, load_spec_file, validate_spec
from dapo_ablate.core.config import ConfigError, read_yaml, resolve_relative_paths
from dapo_ablate.core.config_errors import shown_value
from dapo_ablate.core.yamlio import YAMLFileError, YAMLSyntaxError, load_yaml_text

YAML11_MISSED_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


class OverrideError(ValueError):
    """A malformed or unknown override, as one sentence."""


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """["a.b=1", "c=x"] -> {"a.b": 1, "c": "x"}, values as YAML scalars."""
    parsed: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise OverrideError(f"override {shown_value(item)} is not key=value; write e.g. schedule.total_steps=5")
        try:  # under the YAML file limits: an alias bomb or a 100 MB value is one sentence, not a hang
            value = load_yaml_text(raw, f"override {key.strip()!r}") if raw.strip() else ""
        except YAMLSyntaxError:
            value = raw
        except YAMLFileError as err:
            raise OverrideError(str(err)) from None
        if isinstance(value, str) and YAML11_MISSED_FLOAT.match(value):
            value = float(value)  # YAML 1.1 reads 1e-6 as a string
        parsed[key.strip()] = value
    return parsed


def dotted_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Every leaf path of a nested dict, dotted."""
    keys = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        keys.extend(dotted_keys(value, path + ".") if isinstance(value, dict) and value else [path])
    return keys


def unknown_key_sentence(key: str, known: list[str], what: str = "config") -> str:
    """One sentence for an override whose path does not exist, with the closest known paths: the
    fields whose path ends the same (`eps_high` -> `trainer.algorithm.eps_high`), else the most
    alike by spelling."""
    close = [path for path in known if path.endswith("." + key)][:2] or difflib.get_close_matches(key, known, n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else f"; see the {what}'s documented fields"
    return f"override {key!r} is not a {what} field{hint}"


# ------------------------------------------------------------------------ experiment and sweep specs
def load_spec_with_overrides(model: type, path: str | Path, items: list[str] | None, kind: str) -> Any:
    """The spec file validated as `model` with command-line overrides applied to its data.

    Raises OverrideError for a malformed or unknown key, SpecError (the file's own sentence, its
    source saying "with overrides") for a bad value."""
    values = parse_overrides(items)
    if not values:
        return load_spec_file(model, path, kind)
    for key in values:
        if not is_field_path(model, key):
            raise OverrideError(unknown_key_sentence(key, field_paths(model, like=key), what=kind))
    path = Path(path)
    try:
        data = read_yaml(path)
    except ConfigError as err:
        raise SpecError(str(err).replace("config file", f"{kind} file", 1)) from None
    for key, value in values.items():
        set_in_file_data(data, key, value, path.parent)
    try:
        return validate_spec(model, data, source=f"{path} with overrides", base=path.parent, from_file=True)
    except SpecError as err:
        raise SpecError(_with_command_line_fix(str(err))) from None


def _with_command_line_fix(sentence: str) -> str:
    """A field the file sets that an override made pointless ("`resolution`: only applies to design:
    fractional ...; remove it") can also be removed where the override was typed: `resolution=null`."""
    found = re.search(r"`([\w.]+)`: [^`]*; remove it$", sentence)
    if found is None:
        return sentence
    return f"{sentence} from the file, or add `{found.group(1)}=null` to the command line"


def field_paths(model: type, prefix: str = "", like: str = "") -> list[str]:
    """Every dotted field path of a pydantic model, nested sections included (for "did you mean").
    Under a free mapping (a sweep's `space`) the key is taken from `like`, the path asked for:
    like="space.eps_high.highest" gives space.eps_high.low, space.eps_high.high, ..."""
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        section = _section_model(field.annotation)
        if section is not None:
            paths.extend(field_paths(section, path + ".", like))
        elif _is_mapping(field.annotation) and _mapping_value(field.annotation) is not None:
            asked = like.split(".")
            depth = path.count(".") + 1
            if len(asked) > depth and like.startswith(path + "."):
                paths.extend(field_paths(_mapping_value(field.annotation), f"{path}.{asked[depth]}.", like))
    return paths


def is_field_path(model: type, dotted: str) -> bool:
    """Whether `dotted` names a field of the model: a section, a field inside one, or any key
    inside a free mapping field (a sweep's `space.eps_high.high`)."""
    parts = dotted.split(".")
    node: Any = model
    while parts:
        part = parts.pop(0)
        if node is None:  # past a leaf: a list or a scalar has no fields
            return False
        if _is_mapping(node):
            node = _mapping_value(node)
            continue
        field = node.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
        node = _section_model(annotation) or (annotation if _is_mapping(annotation) else None)
    return True


def set_in_file_data(data: dict[str, Any], dotted: str, value: Any, base: Path) -> None:
    """data[a][b] = value for "a.b", creating sections the file leaves out. A `trainer:` given as
    a file name is read into the data first (relative to `base`, the spec's folder), so that
    `trainer.algorithm.eps_high` can be set in it."""
    *parents, leaf = dotted.split(".")
    node = data
    for depth, key in enumerate(parents):
        if node.get(key) is None:
            node[key] = {}
        elif depth == 0 and key == "trainer" and isinstance(node[key], (str, Path)):
            node[key] = _read_trainer_file(base / Path(node[key]).expanduser())
        if not isinstance(node[key], dict):
            section = ".".join(parents[: depth + 1])
            raise OverrideError(
                f"override {dotted!r} sets a field inside `{section}`, which the file gives as {node[key]!r}; "
                f"override the whole `{section}` instead, e.g. {section}={{...}}"
            )
        node = node[key]
    node[leaf] = value


def _read_trainer_file(path: Path) -> dict[str, Any]:
    """A spec's trainer file as data, its relative model and data paths resolved against its folder."""
    try:
        return resolve_relative_paths(read_yaml(path), path.parent)
    except ConfigError as err:
        raise SpecError(str(err).replace("config file", "trainer file", 1)) from None


def _section_model(annotation: Any) -> type | None:
    """The pydantic model a field holds (`X` or `X | None`), or None for a plain value."""
    from pydantic import BaseModel

    candidates = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _is_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict


def _mapping_value(annotation: Any) -> Any:
    """What a free mapping field holds under each key: a section model, or None for plain values."""
    args = typing.get_args(annotation)
    return _section_model(args[1]) if len(args) == 2 else None
