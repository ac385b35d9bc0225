"""Reading YAML a user hands us, safely: one sentence for every way a file or a string can be wrong.

`yaml.safe_load` builds no objects, but it still follows aliases: a "billion laughs" file of a few
hundred bytes shares one list a billion times, and the first code that walks or serialises it
(validation, json.dumps, repr) exhausts memory. The expanded size is counted here, with an early
stop, before anything else sees the data. Files that are not regular files, too large, or not
UTF-8 are refused by name. A command-line override's value goes through `load_yaml_text`, the same
guard without the file.

Parsing uses libyaml's loader where PyYAML has it: about 5x faster than the pure-Python one (a
1 MiB flat list: about 2 s against 11 s) and it refuses nesting deeper than 1,000 levels itself;
the pure-Python loader recurses, so its RecursionError is caught too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .config_errors import not_a_file_error, not_a_file_mode, one_line, shown_key, shown_path, shown_value

MAX_FILE_BYTES = 2**20  # a config or spec is a few KB; parsing 1 MiB already takes seconds
MAX_EXPANDED_NODES = 200_000  # a real config has a few hundred; a 2^10-cell spec a few thousand
MAX_INTEGER = 2**63 - 1
"""Largest integer a YAML file or override value may hold (int64, what numpy, torch and SQL hold)."""


class _PlainLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader, building plain data only (what JSON holds: mappings, lists, strings,
    numbers, booleans, null), so that whatever reads a config can copy it through json:

    - a date or time (`2024-01-01`, in YAML 1.1 an implicit timestamp) stays the text it was: no
      config field is a date, and a name or a path that looks like one is meant as text;
    - `!!binary`, `!!set`, `!!omap` and `!!pairs` are refused at their line and column;
    - an integer past 4,300 digits, which int() refuses, is refused at its line and column.

    `load_yaml_text` then refuses an integer outside the 64 bits of MAX_INTEGER by its key: no
    setting takes one, and past them a count turned into a float (the plan's time estimate), a
    numpy or torch integer or a database column overflows."""


def _plain_text(loader: Any, node: Any) -> str:
    return loader.construct_scalar(node)


def _not_plain(loader: Any, node: Any) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"{node.tag.replace('tag:yaml.org,2002:', '!!')} is not plain data (write text, a number, "
        "a list or a mapping)", node.start_mark,
    )


def _number(tag: str, what: str) -> None:
    construct = _PlainLoader.yaml_constructors[tag]

    def build(loader: Any, node: Any) -> Any:
        try:
            value = construct(loader, node)
        except (ValueError, OverflowError) as err:
            reason = str(err).split(";")[0].split(": value has")[0]
            raise yaml.constructor.ConstructorError(
                None, None, f"{shown_value(node.value, 40)} cannot be read as {what} "
                f"({reason[:1].lower() + reason[1:]})", node.start_mark,
            ) from None
        return value

    _PlainLoader.add_constructor(tag, build)


_number("tag:yaml.org,2002:int", "an integer")
_number("tag:yaml.org,2002:float", "a number")
_PlainLoader.add_constructor("tag:yaml.org,2002:timestamp", _plain_text)
for _tag in ("binary", "set", "omap", "pairs"):
    _PlainLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _not_plain)
_LOADER = _PlainLoader


class YAMLFileError(ValueError):
    """A YAML file or string that cannot be used, as one sentence naming it and the fix."""


class YAMLSyntaxError(YAMLFileError):
    """Text that is not valid YAML at all (a caller may fall back to reading it as a plain string)."""


def expanded_nodes(data: Any, limit: int = MAX_EXPANDED_NODES) -> int:
    """Nodes of ``data`` counted as if every alias were expanded, stopping past ``limit``."""
    count, stack = 0, [data]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            break
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def load_yaml_text(text: str, name: str) -> Any:
    """The value of the YAML ``text`` (any type; None for empty text), under the file limits: at
    most MAX_FILE_BYTES, nesting libyaml accepts, at most MAX_EXPANDED_NODES values with aliases
    expanded. ``name`` starts each sentence (e.g. "override 'seeds'"). Raises YAMLSyntaxError for
    text that is not YAML, YAMLFileError for the rest."""
    try:
        size = len(text.encode("utf-8")) if len(text) <= MAX_FILE_BYTES else len(text)
    except UnicodeEncodeError as err:  # a lone surrogate: undecodable bytes on a command line
        raise YAMLFileError(f"{name} is not UTF-8 text (character {err.start}); write it in UTF-8") from None
    if size > MAX_FILE_BYTES:
        raise YAMLFileError(f"{name} is larger than {MAX_FILE_BYTES // 2**20} MB; a config is a few KB, check it")
    try:
        data = yaml.load(text, Loader=_LOADER)  # a safe loader: plain data only (_PlainLoader)
    except yaml.YAMLError as err:
        raise YAMLSyntaxError(f"{name} is not valid YAML ({_problem(err)}); fix its syntax") from None
    except (ValueError, OverflowError) as err:  # a scalar Python cannot build, from a loader without the guard
        raise YAMLSyntaxError(f"{name} is not valid YAML ({one_line(str(err).split(';')[0], 200)}); fix its syntax") from None
    except RecursionError:
        raise YAMLFileError(f"{name} nests deeper than can be read; a config nests a few levels, flatten it") from None
    if expanded_nodes(data) > MAX_EXPANDED_NODES:
        raise YAMLFileError(
            f"{name} expands to more than {MAX_EXPANDED_NODES:,} values through YAML aliases; "
            "write the values out instead of nesting aliases"
        )
    huge = _integer_past_64_bits(data)
    if huge is not None:
        where, value = huge
        raise YAMLFileError(f"{name}{f': `{where}`' if where else ''} is {shown_value(value, 30)}, outside the 64-bit integers "
                            "(about -9.2e18 to 9.2e18) that any setting takes; give a smaller number")
    return data


def _integer_past_64_bits(data: Any) -> tuple[str, int] | None:
    """The dotted path (list items as [i]) and value of an integer (a key or a value) outside
    -MAX_INTEGER-1..MAX_INTEGER, if ``data`` holds one (walked after `expanded_nodes` bounded it)."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, int) and not isinstance(node, bool) and not -MAX_INTEGER - 1 <= node <= MAX_INTEGER:
            return path, node
        if isinstance(node, dict):
            stack.extend((path, key) for key in node)
            stack.extend((f"{path}.{shown_key(key)}" if path else shown_key(key), value) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((f"{path}[{index}]", item) for index, item in enumerate(node))
    return None


def _problem(err: yaml.YAMLError) -> str:
    """What the parser objected to and where, on one line, with the construct it was inside when
    that started elsewhere (`did not find expected ',' or ']' at line 3, column 6, while parsing a
    flow sequence at line 2, column 10`). Lines and columns count from 1, as editors show them."""
    problem = one_line(getattr(err, "problem", None) or err.__class__.__name__, 200)
    mark = getattr(err, "problem_mark", None)
    where = f"{problem} at {_position(mark)}" if mark is not None else problem
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and context_mark is not None and _position(context_mark) != _position(mark):
        where += f", {one_line(context, 200)} at {_position(context_mark)}"
    return where


def _position(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def read_yaml_mapping(path: str | Path, kind: str = "config file") -> dict[str, Any]:
    """The top-level mapping of a YAML file ({} for an empty file), or YAMLFileError."""
    path = Path(path)
    name = f"{kind} {shown_path(path)}"
    try:
        info = path.stat()
    except OSError as err:
        raise YAMLFileError(f"{name} {not_a_file_error(err, path, 'check the path')}") from None
    if problem := not_a_file_mode(info.st_mode):
        raise YAMLFileError(f"{name} {problem}; give the path of a YAML file")
    if info.st_size > MAX_FILE_BYTES:
        raise YAMLFileError(f"{name} is larger than {MAX_FILE_BYTES // 2**20} MB; a config is a few KB, check the path")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise YAMLFileError(f"{name} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    except OSError as err:
        raise YAMLFileError(f"{name} {not_a_file_error(err, path, 'check the path')}") from None
    data = load_yaml_text(text, name)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise YAMLFileError(f"{name} must hold a mapping of sections at its top level")
    return data
