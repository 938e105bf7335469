"""The PSI/J exceptions, with psij-python's names and constructor arguments."""

from __future__ import annotations


class _PsijError(Exception):
    def __init__(self, message: str, exception: BaseException | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exception = exception

    def __str__(self) -> str:
        return self.message


class InvalidJobException(_PsijError):
    """The job can never run as specified; submitting it again fails the same way."""


class SubmitException(_PsijError):
    """The request could not reach the pilot; ``transient`` says whether retrying may help."""

    def __init__(self, message: str, exception: BaseException | None = None, transient: bool = False) -> None:
        super().__init__(message, exception)
        self.transient = transient


class InvalidStateException(_PsijError):
    """The job is in a state that does not allow the request (e.g. submitted twice)."""
