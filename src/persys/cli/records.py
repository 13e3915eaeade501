"""`@record`: the part of `@dataclass` persysctl's quick path uses (an `__init__` over the
annotated fields, with defaults; `__eq__`; `__repr__`), without importing `dataclasses`, which
loads `inspect` and `ast`: about 7 % of a quick command's start. Typed through
`dataclass_transform`, so mypy checks the constructors as it checks a dataclass's."""

from __future__ import annotations

from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform()
def record(cls: type[T]) -> type[T]:
    names = tuple(cls.__dict__.get("__annotations__", {}))  # noqa: RUF063 (inspect is what this avoids)
    defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        for name, value in _bound(cls.__name__, names, defaults, args, kwargs).items():
            setattr(self, name, value)

    def __eq__(self: Any, other: object) -> bool:  # noqa: N807
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in names)

    def __repr__(self: Any) -> str:  # noqa: N807
        return f"{cls.__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + ")"

    setattr(cls, "__init__", __init__)  # noqa: B010
    setattr(cls, "__eq__", __eq__)  # noqa: B010
    setattr(cls, "__repr__", __repr__)  # noqa: B010
    setattr(cls, "__hash__", None)  # noqa: B010 (mutable and compared by value: unhashable, as a dataclass)
    return cls


def _bound(cls_name: str, names: tuple[str, ...], defaults: dict[str, Any], args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> dict[str, Any]:
    """Each field's value from a constructor call, as a dataclass's `__init__` would bind it."""
    if len(args) > len(names):
        raise TypeError(f"{cls_name}() takes {len(names)} arguments, {len(args)} given")
    values = dict(zip(names, args, strict=False))
    for key, value in kwargs.items():
        if key not in names or key in values:
            raise TypeError(f"{cls_name}() got an unexpected or repeated argument {key!r}")
        values[key] = value
    for name in names:
        if name not in values:
            if name not in defaults:
                raise TypeError(f"{cls_name}() missing argument {name!r}")
            value = defaults[name]  # a list or dict default is each instance's own, as default_factory
            values[name] = type(value)(value) if isinstance(value, list | dict | set) else value
    return {name: values[name] for name in names}
