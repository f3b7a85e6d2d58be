"""Errors every layer may raise; the CLI prints them as "what happened — what to do"."""


class MemfsError(Exception):
    """A refusal with a remedy. `remedy` says what the user can do about it."""

    def __init__(self, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def __str__(self) -> str:
        return f"{self.message} — {self.remedy}" if self.remedy else self.message
