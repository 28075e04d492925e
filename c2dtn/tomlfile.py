"""Reading and checking TOML configuration files, with errors naming file, field and value."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from c2dtn.errors import ConfigError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")


# no config of c2dtn nests deeper than a few tables; a file nested deeper is refused before
# anything walks it (the walks recurse, and Python's recursion limit is not a typed refusal)
MAX_DEPTH = 32


def read_toml(path: str | Path) -> dict[str, Any]:
    src = str(path)
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except RecursionError:  # tomllib's parser recurses into nested arrays and inline tables
        raise ConfigError(src, "-", src, f"nested more than {MAX_DEPTH} deep") from None
    except OSError as e:
        raise ConfigError(src, "-", src, f"cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(src, "-", src, f"not valid TOML: {e}") from None
    except UnicodeDecodeError as e:  # tomllib decodes before it parses (found by perf fuzz)
        raise ConfigError(src, "-", src, f"not UTF-8 text: byte {e.object[e.start]:#04x} at offset {e.start}") from None
    _check_depth(src, doc)
    return doc


def _check_depth(src: str, doc: dict[str, Any]) -> None:
    """Refuse tables and arrays nested more than MAX_DEPTH deep (dotted keys nest tables
    without recursing in the parser), walking without recursion."""
    todo: list[tuple[Any, int]] = [(doc, 1)]
    while todo:
        v, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(src, "-", src, f"nested more than {MAX_DEPTH} deep")
        if isinstance(v, dict):
            todo += [(x, depth + 1) for x in v.values()]
        elif isinstance(v, list):
            todo += [(x, depth + 1) for x in v]


def check_private(src: str, where: str) -> None:
    """A file holding keys must be readable and writable by its owner alone, and that owner us
    or root (as ssh insists of a private key): anyone else who reads it can forge and read
    every envelope, and its owner could swap the keys."""
    try:
        st = os.stat(src)
    except OSError:
        return  # read a moment ago; gone now: nothing to judge
    mode = st.st_mode & 0o777
    if st.st_uid not in (0, os.getuid()):
        raise ConfigError(
            src,
            where,
            f"owner uid {st.st_uid}",
            "a file holding keys must belong to the user the node runs as (or root): its owner can change them",
            f"chown {os.getuid()} {src}",
        )
    if mode & 0o077:
        raise ConfigError(
            src,
            where,
            f"file mode {mode:04o}",
            "permissions too open for a file holding keys: other users can read or change them",
            f"chmod 600 {src}",
        )


def check_table(src: str, where: str, table: Any, allowed: set[str], required: set[str] = frozenset()) -> dict:
    """`table` is a table with only `allowed` keys and every `required` one."""
    if not isinstance(table, dict):
        raise ConfigError(src, where, table, "must be a table")
    for k in table:
        if k not in allowed:
            raise ConfigError(src, f"{where}.{k}", table[k], "unknown field", "known: " + ", ".join(sorted(allowed)))
    for k in required:
        if k not in table:
            raise ConfigError(src, f"{where}.{k}", None, "missing")
    return table


def check_name(src: str, where: str, v: Any) -> str:
    if not isinstance(v, str) or not NAME.fullmatch(v):
        raise ConfigError(src, where, v, "a name is 1-40 letters, digits, '-' or '_', starting with a letter or digit")
    return v
