"""Error types shared by every component."""

from __future__ import annotations


class C2Error(Exception):
    """Base of every error c2dtn reports to a person."""


class ConfigError(C2Error):
    """A configuration value is wrong: names the file, the field and the value."""

    def __init__(self, source: str, field: str, value: object, problem: str, hint: str = ""):
        self.source = source
        self.field = field
        self.value = value
        self.problem = problem
        self.hint = hint
        msg = f"{source}: field '{field}' = {value!r}: {problem}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)
