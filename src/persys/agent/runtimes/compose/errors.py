"""What a refused compose file's status says: the file and where, never its text.

`docker compose config` quotes the document in its errors (keys a schema refuses, the text near a
parse error), and statuses travel to events and backups: a compose `path` naming a secret file
would publish it. So the message keeps only the kind of problem and its position.
"""

from __future__ import annotations

import json
import re

from persys.model.documents import DocumentError
from persys.policy.compose_yaml import load_compose

# Keys through which Compose reads other files (whose text its errors could then quote).
_FILE_KEYS = ('"env_file"', '"include"', '"extends"', '"file"', '"build"')
_GO_YAML_POS = re.compile(r"\bL(\d+)\.C(\d+)")
_LINE_POS = re.compile(r"\bline (\d+)(?:, column (\d+))?")


def _position(text: str) -> str:
    if m := _GO_YAML_POS.search(text):
        return f" at line {m.group(1)}, column {m.group(2)}"
    if m := _LINE_POS.search(text):
        return f" at line {m.group(1)}" + (f", column {m.group(2)}" if m.group(2) else "")
    return ""


def config_error(output: str, file_name: str) -> str:
    """A one-line reason for a failed `docker compose config`, free of the file's content."""
    low = output.lower()
    where = _position(output)
    if "yaml" in low and ("parse" in low or "load error" in low or "did not find" in low or "mapping" in low):
        kind = "not valid YAML"
    elif "validating" in low or "schema" in low or "additional propert" in low or "not allowed" in low:
        kind = "refused by the Compose schema (unknown or mistyped keys)"
    elif "interpolat" in low or "variable" in low:
        kind = "a ${VARIABLE} cannot be interpolated"
    elif "no such file" in low or "not found" in low:
        kind = "a file it refers to is missing"
    else:
        kind = "refused by docker compose config"
    return f"invalid compose file {file_name}: {kind}{where} (the file's text is not repeated here; " \
           f"run `docker compose config` on the node for details)"


def quotes_only_itself(inline: str | None) -> bool:
    """Whether Compose's errors about this document can quote nothing but the document itself:
    an inline document (the client's own text) that makes Compose read no other file."""
    if inline is None:
        return False
    try:
        doc = load_compose(inline)
    except DocumentError:
        return True  # Compose cannot parse it either: it stops at this text
    text = json.dumps(doc)
    return not any(k in text for k in _FILE_KEYS)
