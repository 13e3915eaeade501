"""Shared pydantic base: camelCase on the wire, snake_case in Python, unknown fields refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    """Base for every manifest and stored document.

    `extra="forbid"` is what turns a typo in a manifest into an error naming the field
    instead of a silently ignored setting.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=False,
        strict=False,
        validate_default=True,
    )

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()

    def to_doc(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
