"""An import-linter contract type the stock ones lack: an allow-list.

`forbidden` names what a package may not import, so a new package slips past it; this names
what it may import (besides itself and anything outside the root package) and breaks on
anything else. Registered in pyproject.toml (`contract_types`); lint-imports puts the working
directory on the path, so it runs from the repository's root as every script does.
"""

from __future__ import annotations

from typing import Any

import grimp
from importlinter import Contract, ContractCheck, fields, output


def _within(module: str, packages: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


class AllowListContract(Contract):
    """Modules of `source_modules` (and their descendants) import only from `allowed_modules`,
    their own package, or outside the root package."""

    type_name = "allow_list"
    source_modules = fields.ListField(subfield=fields.StringField())
    allowed_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        sources: list[str] = list(self.source_modules)  # type: ignore[call-overload]
        allowed: list[str] = list(self.allowed_modules)  # type: ignore[call-overload]
        roots = list(self.session_options.get("root_packages") or [self.session_options["root_package"]])
        broken: list[dict[str, Any]] = []
        for source in sources:
            for importer in sorted({source} | graph.find_descendants(source)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if not _within(imported, roots) or _within(imported, [source, *allowed]):
                        continue
                    lines = [d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)]
                    broken.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for b in check.metadata["broken"]:
            where = ", ".join(f"l.{n}" for n in b["lines"])
            output.print_error(f"{b['importer']} imports {b['imported']} ({where}): not on the allow-list")
            output.new_line()
