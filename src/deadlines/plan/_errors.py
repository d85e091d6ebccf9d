"""`PlanError`: malformed planner input, located by file, line and what was expected."""

from __future__ import annotations


class PlanError(ValueError):
    """The planner's input is malformed: says which file, which line and what was expected.

    ``str(error)`` reads ``FILE:LINE: WHERE: expected ..., got ...`` so an editor can
    jump to it; the parts are also attributes.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        where: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.where = where
        super().__init__(self._text())

    def _text(self) -> str:
        location = ""
        if self.file is not None:
            location = self.file if self.line is None else f"{self.file}:{self.line}"
            location += ": "
        where = f"{self.where}: " if self.where else ""
        return f"{location}{where}{self.message}"
