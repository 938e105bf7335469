"""JobAttributes: walltime (``duration``, 10 minutes by default as the spec says), queue, account."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class JobAttributes:
    def __init__(
        self,
        duration: timedelta = timedelta(minutes=10),
        queue_name: str | None = None,
        account: str | None = None,
        reservation_id: str | None = None,
        custom_attributes: dict[str, Any] | None = None,
        project_name: str | None = None,
    ) -> None:
        self.duration = duration
        self.queue_name = queue_name
        self.account = account if account is not None else project_name
        self.reservation_id = reservation_id
        self._custom_attributes: dict[str, Any] = dict(custom_attributes or {})

    @property
    def project_name(self) -> str | None:
        return self.account

    @project_name.setter
    def project_name(self, value: str | None) -> None:
        self.account = value

    @property
    def custom_attributes(self) -> dict[str, Any]:
        return self._custom_attributes

    @custom_attributes.setter
    def custom_attributes(self, value: dict[str, Any] | None) -> None:
        self._custom_attributes = dict(value or {})

    def set_custom_attribute(self, name: str, value: Any) -> None:
        self._custom_attributes[name] = value

    def get_custom_attribute(self, name: str) -> Any:
        return self._custom_attributes.get(name)

    def __repr__(self) -> str:
        return (
            f"JobAttributes(duration={self.duration}, queue_name={self.queue_name!r}, account={self.account!r}, "
            f"reservation_id={self.reservation_id!r}, custom_attributes={self._custom_attributes!r})"
        )
