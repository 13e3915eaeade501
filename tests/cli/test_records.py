"""`persys.cli.records.record`: what the quick path's command and configuration classes rely on
from `@dataclass`, without importing it."""

from __future__ import annotations

import pytest

from persys.cli.records import record


@record
class Point:
    x: int
    y: int = 0
    tags: list[str] = []  # each instance gets its own copy, as with default_factory


def test_fields_defaults_equality_and_repr() -> None:
    assert Point(1).y == 0 and Point(1, 2).y == 2 and Point(x=3, y=4) == Point(3, 4)
    assert Point(1) != Point(2) and Point(1).__eq__((1, 0)) is NotImplemented
    assert repr(Point(1, tags=["a"])) == "Point(x=1, y=0, tags=['a'])"
    a, b = Point(1), Point(1)
    a.tags.append("t")
    assert b.tags == [] and Point.tags == []
    with pytest.raises(TypeError):
        hash(a)


@pytest.mark.parametrize("args,kwargs", [((), {}), ((1, 2, [], 4), {}), ((1,), {"x": 2}), ((1,), {"z": 0})])
def test_wrong_arguments_are_refused(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        Point(*args, **kwargs)  # type: ignore[arg-type]
