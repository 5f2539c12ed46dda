"""The error for bad user input: it names the parameter, so the server can report `param`."""

from __future__ import annotations


class InvalidParameter(ValueError):
    """A user-settable value outside its allowed range or of the wrong kind."""

    def __init__(self, param: str, message: str, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code
