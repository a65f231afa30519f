"""Reading compute.yaml as people write it, and writing back only what changed.

A ruamel.yaml round trip: comments, blank lines, key order, quoting, indentation and unknown keys
survive; a comment stays with the entry it follows when entries are added, edited or removed; YAML
errors are reported with the file's own line numbers (after an explicit ``---`` too).
"""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark, MarkedYAMLError
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.scalarbool import ScalarBoolean
from ruamel.yaml.scalarfloat import ScalarFloat
from ruamel.yaml.scalarint import ScalarInt
from ruamel.yaml.tokens import CommentToken

from ..errors import ConfigFileError


# -- YAML round trip ----------------------------------------------------------------
class _Resolver(VersionedResolver):
    """YAML 1.2 resolution minus timestamps: ``created: 2026-11-29T10:02:00Z`` loads as the
    plain string it is, and a string written back stays unquoted (ruamel would otherwise
    load a datetime, or quote a string that looks like one)."""

    def add_version_implicit_resolver(self, version: Any, tag: Any, regexp: Any, first: Any) -> None:
        if tag == "tag:yaml.org,2002:timestamp":
            return
        super().add_version_implicit_resolver(version, tag, regexp, first)


_KEY_ONLY = re.compile(r"""^(?:"[^"]*"|'[^']*'|[^\s#'"][^#]*?)\s*:\s*(?:#.*)?$""")
_DOC_START = re.compile(r"^---(?:\s.*)?$")


def _guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping, sequence, offset) as ruamel's ``YAML.indent`` wants them, read off the file,
    so a save does not re-indent what it did not change."""
    mapping: int | None = None
    sequence: int | None = None
    offset: int | None = None
    parent: int | None = None  # indent of the previous line if it was a bare "key:"
    for line in text.splitlines():
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if parent is not None and indent >= parent:
            if body.startswith("- ") or body == "-":
                if offset is None:
                    offset = indent - parent
                    after = line[indent + 1 :]
                    sequence = offset + 1 + len(after) - len(after.lstrip(" ")) if after.strip() else offset + 2
            elif mapping is None and indent > parent:
                mapping = indent - parent
        if mapping is not None and offset is not None:
            break
        parent = indent if _KEY_ONLY.match(body) else None
    mapping = mapping or 2
    if offset is None:
        offset, sequence = 0, mapping
    sequence = max(sequence or 2, offset + 2)
    return mapping, sequence, offset


def make_yaml(text: str) -> YAML:
    y = YAML()  # round trip
    y.Resolver = _Resolver
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap a long line
    mapping, sequence, offset = _guess_indent(text)
    y.indent(mapping=mapping, sequence=sequence, offset=offset)
    return y


def split_document_start(text: str) -> tuple[str, str]:
    """Split off everything up to an explicit ``---`` line: ruamel drops comments above it."""
    offset = 0
    for line in text.splitlines(keepends=True):
        body = line.strip()
        if _DOC_START.match(body):
            return text[: offset + len(line)], text[offset + len(line) :]
        if body and not body.startswith("#") and not body.startswith("%"):
            break
        offset += len(line)
    return "", text


# -- keeping comments where they belong -------------------------------------------------
# ruamel attaches the comment lines (and blank lines) that follow a node to the last
# scalar before them: "# about b" above entry b belongs, for ruamel, to entry a's last
# key. Adding or removing keys would then carry such lines along or drop them. These
# helpers move "what follows the last line" from one node to another around a change.
def _is_block(node: Any) -> bool:
    return isinstance(node, (CommentedMap, CommentedSeq)) and len(node) > 0 and not node.fa.flow_style()


def _tail_slot(container: Any, key: Any) -> tuple[list[Any], int]:
    """The comment slot that holds what follows the last line of ``container[key]``."""
    value = container[key]
    if _is_block(value):
        last = next(reversed(value)) if isinstance(value, CommentedMap) else len(value) - 1
        return _tail_slot(value, last)
    slot = container.ca.items.setdefault(key, [None, None, None, None])
    return slot, 2 if isinstance(container, CommentedMap) else 0


def take_following(container: Any, key: Any) -> str:
    """Detach and return the lines after ``container[key]``'s own last line (blank lines, comments)."""
    slot, index = _tail_slot(container, key)
    token = slot[index]
    if token is None:
        return ""
    value = token.value
    cut = value.find("\n") + 1 if not value.startswith("\n") else 1
    if cut == 0:
        return ""
    # Mutate in place: a flow collection's token is shared with its parent's slot.
    token.value = value[:cut] if not value.startswith("\n") else "\n"
    return value[cut:]


def _attach(slot: list[Any], index: int, text: str) -> None:
    """Append whole lines to the comment in ``slot[index]``, creating it if there is none."""
    if not text:
        return
    token = slot[index]
    if token is None:
        # A leading newline ends the line the comment hangs on: no inline part.
        slot[index] = CommentToken("\n" + text, CommentMark(0), None)
    else:
        token.value = (token.value if token.value.endswith("\n") else token.value + "\n") + text


def put_following(container: Any, key: Any, text: str) -> None:
    """Attach ``text`` (whole lines) after ``container[key]``'s last line."""
    if text:
        _attach(*_tail_slot(container, key), text)


def _put_after_header(owner: CommentedMap, key: Any, text: str) -> None:
    """Attach ``text`` right after the ``key:`` line of ``owner`` (before its first child)."""
    if text:
        _attach(owner.ca.items.setdefault(key, [None, None, None, None]), 2, text)


@contextmanager
def keeping_tail(container: Any, key: Any) -> Iterator[None]:
    """Keep the lines that follow ``container[key]`` after it while its content changes."""
    following = take_following(container, key)
    yield
    put_following(container, key, following)


def append_entry(mapping: CommentedMap, key: str, value: Any) -> None:
    """Add ``key`` at the end of ``mapping``, before the lines that followed its old last item."""
    if len(mapping):
        last = next(reversed(mapping))
        following = take_following(mapping, last)
        mapping[key] = value
        put_following(mapping, key, following)
    else:
        if mapping.fa.flow_style():
            mapping.fa.set_block_style()
        mapping[key] = value


def delete_entry(owner: CommentedMap, owner_key: Any, mapping: CommentedMap, key: str) -> None:
    """Remove ``key`` from ``mapping`` (``owner[owner_key]``), keeping the lines that followed it."""
    keys = list(mapping)
    position = keys.index(key)
    following = take_following(mapping, key)
    del mapping[key]
    mapping.ca.items.pop(key, None)  # ruamel leaves it behind; a re-added key would inherit it
    if position > 0:
        put_following(mapping, keys[position - 1], following)
    elif len(mapping) and not mapping.fa.flow_style():
        _put_after_header(owner, owner_key, following)
    else:
        put_following(owner, owner_key, following)


def same_value(old: Any, new: Any) -> bool:
    value = plain(old)
    return type(value) is type(new) and value == new


def plain(value: Any) -> Any:
    """ruamel's round-trip scalars and collections as plain Python values."""
    if isinstance(value, ScalarBoolean):
        return bool(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, ScalarInt):
        return int(value)
    if isinstance(value, ScalarFloat):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def yaml_problem(error: MarkedYAMLError, line_offset: int) -> tuple[int, str]:
    """(1-based line, problem) of a YAML syntax error, in words a person can act on."""
    mark = error.problem_mark or error.context_mark
    line = (mark.line if mark else 0) + 1 + line_offset
    problem = (error.problem or "not valid YAML").strip()
    # A duplicate key's message repeats both values; the key is enough to find it.
    problem = re.sub(r' with value ".*', "", problem, flags=re.DOTALL)
    if error.context:
        context = error.context.strip()
        if error.context_mark and error.problem_mark and error.context_mark.line != error.problem_mark.line:
            context += f" (from line {error.context_mark.line + 1 + line_offset})"
        problem = f"{problem}, {context}"
    return line, problem


# -- the parsed file --------------------------------------------------------------------
@dataclasses.dataclass
class YamlDocument:
    path: Path
    yaml: YAML
    prefix: str  # text up to an explicit "---", written back verbatim
    body: str
    line_offset: int
    crlf: bool  # ruamel mangles CR LF in comments: edit with LF, write back with CR LF
    root: CommentedMap | None
    machines: CommentedMap | None
    pools: CommentedMap | None = None  # compute.yaml's ``pools:`` (machines/pools.py)

    def line(self, container: Any, key: Any, *, value: bool = False) -> int:
        try:
            row = container.lc.value(key)[0] if value else container.lc.key(key)[0]
        except (AttributeError, KeyError, TypeError):
            row = getattr(getattr(container, "lc", None), "line", 0) or 0
        return row + 1 + self.line_offset

    def error(self, line: int, problem: str) -> ConfigFileError:
        return ConfigFileError(f"{self.path}, line {line}: {problem}")

    def dump(self) -> bytes:
        out = io.StringIO()
        self.yaml.dump(self.root, out)
        text = self.prefix + out.getvalue()
        return (text.replace("\n", "\r\n") if self.crlf else text).encode("utf-8")
