"""Reading YAML files a user hands us, safely: one sentence for every way a file can be wrong.

`yaml.safe_load` builds no objects, but it still follows aliases: a "billion laughs" file of a few
hundred bytes shares one list a billion times, and the first code that walks or serialises it
(validation, json.dumps, repr) exhausts memory. The expanded size is counted here, with an early
stop, before anything else sees the data. Files that are not regular files, too large, or not
UTF-8 are refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 10 * 2**20
MAX_EXPANDED_NODES = 200_000  # a real config has a few hundred; a 2^10-cell spec a few thousand


class YAMLFileError(ValueError):
    """A YAML file that cannot be used, as one sentence naming it and the fix."""


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


def read_yaml_mapping(path: str | Path, kind: str = "config file") -> dict[str, Any]:
    """The top-level mapping of a YAML file ({} for an empty file), or YAMLFileError."""
    path = Path(path)
    name = f"{kind} {str(path)!r}"
    if not path.exists():
        raise YAMLFileError(f"{name} does not exist; check the path")
    if not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise YAMLFileError(f"{name} is {what}; give the path of a YAML file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise YAMLFileError(f"{name} is larger than {MAX_FILE_BYTES // 2**20} MB; a config is a few KB, check the path")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise YAMLFileError(f"{name} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    except OSError as err:
        raise YAMLFileError(f"{name} cannot be read ({err.strerror}); check its permissions") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise YAMLFileError(f"{name} is not valid YAML ({err.__class__.__name__}); fix its syntax") from None
    if expanded_nodes(data) > MAX_EXPANDED_NODES:
        raise YAMLFileError(
            f"{name} expands to more than {MAX_EXPANDED_NODES:,} values through YAML aliases; "
            "write the values out instead of nesting aliases"
        )
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise YAMLFileError(f"{name} must hold a mapping of sections at its top level")
    return data
