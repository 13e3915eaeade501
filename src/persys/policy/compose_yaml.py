"""An inline Compose document parsed as Compose parses it: anchors, aliases and merge keys (`<<`)
resolved, within bounds.

Compose files use anchors and merge keys a lot (`x-common: &common` ... `<<: *common`), and a
document must be judged with them expanded, as Compose runs it. Aliases can also expand without
bound (a "billion laughs"), which is why persys.model.documents refuses them everywhere else. Here
the parser's node graph (aliases are shared nodes) is measured first: the document is built only
if its expansion stays under MAX_NODES nodes, and nesting under MAX_DEPTH levels.
"""

from __future__ import annotations

from typing import Any

import yaml

from persys.model.documents import DocumentError, check_plain
from persys.model.limits import MAX_DEPTH

MAX_NODES = 200_000  # expanded nodes: far above any real Compose file, far below a memory problem
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _screen_depth(text: str) -> None:
    depth = 0
    for ev in yaml.parse(text, Loader=_Loader):
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise DocumentError(f"nested deeper than {MAX_DEPTH} levels{_where(ev.start_mark)}")
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1


def _expanded_size(root: yaml.Node | None) -> int:
    """How many nodes the document has once every alias is expanded (memoised: linear in the graph);
    a node that contains itself (an alias inside its own anchor) counts as unbounded."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)] if root is not None else []
    while stack:  # post-order without recursion: (node, children done?)
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value))
        if done:
            visiting.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), MAX_NODES + 1)
            continue
        if id(node) in visiting or any(id(c) in visiting for c in children):
            return MAX_NODES + 1
        visiting.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes.get(id(root), 0) if root is not None else 0


def load_compose(text: str) -> Any:
    """The document (None when empty), aliases and merge keys resolved; raises DocumentError
    naming the position of a YAML problem, never the text."""
    try:
        _screen_depth(text)
        root = yaml.compose(text, Loader=_Loader)
        if _expanded_size(root) > MAX_NODES:
            raise DocumentError(f"its aliases expand to more than {MAX_NODES} nodes")
        doc = yaml.load(text, Loader=_Loader)
    except DocumentError:
        raise
    except yaml.YAMLError as err:
        raise DocumentError(f"not valid YAML{_where(getattr(err, 'problem_mark', None))}") from None
    except (ValueError, OverflowError):  # a tagged value the constructor cannot build: `2001-13-45`, `!!int x`
        raise DocumentError("not valid YAML: a value of an impossible type or date (quote it)") from None
    check_plain(doc, MAX_DEPTH)
    return doc
