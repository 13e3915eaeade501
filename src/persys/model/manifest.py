"""Parsing manifests (YAML or JSON, one or several documents) into validated models."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from persys.model.documents import DocumentError, load_yaml_all
from persys.model.workload import WorkloadManifest

T = TypeVar("T")


class ManifestError(ValueError):
    """A manifest that cannot be accepted; `problems` holds one `path: message` line each."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(problems))


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class holding the field at `loc` (a field's path under `model`), or None."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        fields = {(f.alias or n): f for n, f in current.model_fields.items()}
        f = fields.get(part) or current.model_fields.get(part)
        if f is None:
            return None
        current = _model_in(f.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _model_in(annotation: Any) -> Any:
    """The model inside an annotation (Optional, list, Annotated), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    """", did you mean 'x'?" for an unknown field close to a known one of its model."""
    holder = _model_at(model, loc[:-1]) if model is not None and loc else None
    if holder is None or not isinstance(loc[-1], str):
        return ""
    known = [f.alias or n for n, f in holder.model_fields.items()]
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    if not close:
        close = [k for k in known if k.lower() == loc[-1].lower().replace("_", "")]
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_validation_error(err: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """One `path: message` line per problem; with `model`, an unknown field close to a known one
    is named ("did you mean 'cpuMillicores'?"), as kubectl does."""
    problems = []
    for e in err.errors():
        # Model-level validators report under the model's path; their message is the useful part.
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field" + _did_you_mean(model, tuple(e["loc"]))
        elif e["type"] == "missing":
            msg = "required field is missing"
        problems.append(f"{_path(tuple(e['loc']))}: {msg}")
    return problems


def validate_manifest(doc: Any, source: str = "") -> WorkloadManifest:
    if not isinstance(doc, dict):
        raise ManifestError([f"(document): expected a mapping, got {type(doc).__name__}"], source)
    try:
        return WorkloadManifest.model_validate(doc)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err, WorkloadManifest), source) from None


def load_documents(text: str, source: str = "") -> list[Any]:
    """The non-empty documents of `text`; ManifestError if it cannot be read or holds none."""
    try:
        # No aliases, bounded nesting, JSON types only (persys.model.documents).
        docs = [d for d in load_yaml_all(text) if d is not None]
    except DocumentError as err:
        raise ManifestError([str(err)], source) from None
    if not docs:
        raise ManifestError(["(document): no manifest found"], source)
    return docs


def validate_all(docs: list[Any], validate: Callable[[Any], T], source: str = "") -> list[T]:
    """Each document validated; all must be valid or ManifestError lists every problem, prefixed
    with its document's position when there are several."""
    out: list[T] = []
    problems: list[str] = []
    for i, doc in enumerate(docs):
        try:
            out.append(validate(doc))
        except ManifestError as err:
            prefix = f"document {i + 1}: " if len(docs) > 1 else ""
            problems.extend(prefix + p for p in err.problems)
    if problems:
        raise ManifestError(problems, source)
    return out


def parse_manifests(text: str, source: str = "") -> list[WorkloadManifest]:
    """Parse every document in `text`; all must be valid or none is returned."""
    return validate_all(load_documents(text, source), validate_manifest, source)
