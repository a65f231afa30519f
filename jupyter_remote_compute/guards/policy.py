"""Egress rules from the workspace's ``.punica/policy.yaml``: may these files leave for that machine?

The file is shared with other workspace tools. Under its top-level ``rules:`` list, this
module acts only on items written ``deny egress: remote`` or ``allow egress: remote``, each
optionally narrowed by ``paths:`` (workspace-relative globs, ``**`` across directories) and
``machines:`` (names or globs). Everything else is left alone, and the file is only read.

For each file, the last matching egress rule wins. A job with no files still sends its
command, so it is judged by the rules without ``paths:``. A policy that cannot be read
fails closed for remote machines; the built-in local machine sends nothing and is never held.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from ..errors import ConfigFileError, PolicyDenied

__all__ = ["EgressRule", "check_egress", "load_egress_rules"]

_VERBS = ("allow", "deny")
_SCOPE = "remote"
# Annotations a person may add to a rule. Any other key is refused: a misspelt ``path:`` on an
# allow rule would otherwise silently open every file.
_NOTE_KEYS = frozenset({"reason", "description", "comment", "note", "id", "name"})
_HELD = "Jobs on remote machines are held until it is fixed."


@dataclasses.dataclass(frozen=True)
class EgressRule:
    """One ``allow|deny egress: remote`` item; ``None`` scopes mean "all"."""

    verb: str
    line: int  # 1-based, of the ``… egress`` key
    paths: tuple[str, ...] | None
    machines: tuple[str, ...] | None

    def describe(self) -> str:
        """The rule as written, shortened: ``deny egress: remote, paths: data/**``."""
        text = f"{self.verb} egress: {_SCOPE}"
        if self.paths is not None:
            text += ", paths: " + " ".join(self.paths)
        if self.machines is not None:
            text += ", machines: " + " ".join(self.machines)
        return text

    def covers_machine(self, machine: str) -> bool:
        return self.machines is None or any(fnmatch.fnmatchcase(machine, m) for m in self.machines)

    def covers_file(self, path: str) -> bool:
        return self.paths is None or any(_glob_regex(p).fullmatch(path) for p in self.paths)


def check_egress(policy_file: Path, machine: str, remote: bool, files: Sequence[str]) -> None:
    """Raise :class:`PolicyDenied` if the policy forbids sending ``files`` (or, with none, anything) to ``machine``.

    ``files`` are workspace-relative POSIX paths. ``remote`` is False for the built-in local
    machine, which nothing leaves: it is never restricted, even by a policy that cannot be read.
    A missing policy file allows everything. A malformed one raises :class:`ConfigFileError`.
    """
    if not remote:
        return
    rules = load_egress_rules(policy_file)
    if not rules:
        return
    where = _display(policy_file)
    applicable = [r for r in rules if r.covers_machine(machine)]
    if not files:
        # Nothing is sent but the command itself: only rules about everything apply.
        last = next((r for r in reversed(applicable) if r.paths is None), None)
        if last is not None and last.verb == "deny":
            raise PolicyDenied(
                f"{where}:{last.line} ({last.describe()}) forbids running on the remote machine {machine}: "
                "nothing may leave this machine, the job's command included. Run it on local, or change the rule.",
                field="send",
            )
        return
    for raw in files:
        path = _normalise(raw)
        last = next((r for r in reversed(applicable) if r.covers_file(path)), None)
        if last is not None and last.verb == "deny":
            raise PolicyDenied(
                f"{where}:{last.line} ({last.describe()}) forbids sending {path} to the remote machine "
                f"{machine}. Run the job on local, leave the file out, or change the rule.",
                field="send",
            )


def load_egress_rules(policy_file: Path) -> list[EgressRule]:
    """The egress rules of ``policy_file`` in file order; ``[]`` if it does not exist."""
    where = _display(policy_file)
    try:
        text = policy_file.read_text(encoding="utf-8-sig")  # tolerate a BOM left by an editor
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{where}: cannot be read ({_describe(exc)}). {_HELD}") from None
    try:
        document = YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigFileError(f"{where}{line}: not valid YAML ({exc.problem or exc.context}). {_HELD}") from None
    except YAMLError as exc:
        raise ConfigFileError(f"{where}: not valid YAML ({_describe(exc)}). {_HELD}") from None

    if document is None:
        return []
    if not isinstance(document, dict):
        raise ConfigFileError(f"{where}:1: the top level must be a mapping with a rules: list. {_HELD}")
    if "rules" not in document or document["rules"] is None:
        return []
    items = document["rules"]
    if not isinstance(items, list):
        line = document.lc.value("rules")[0] + 1
        raise ConfigFileError(f"{where}:{line}: rules must be a list. {_HELD}")

    rules = []
    for index, item in enumerate(items):
        rule = _egress_rule(item, items.lc.item(index)[0] + 1, where)
        if rule is not None:
            rules.append(rule)
    return rules


def _egress_rule(item: object, item_line: int, where: str) -> EgressRule | None:
    """The egress rule in one ``rules:`` item, ``None`` for another tool's rule, or a ConfigFileError."""
    if not isinstance(item, dict):
        return None
    egress_keys = [k for k in item if isinstance(k, str) and "egress" in k.lower().split()]
    if not egress_keys:
        return None

    def line_of(key: str) -> int:
        try:
            return item.lc.key(key)[0] + 1
        except (AttributeError, KeyError, TypeError):
            return item_line

    def fail(key: str, problem: str) -> ConfigFileError:
        return ConfigFileError(f"{where}:{line_of(key)}: {problem}. {_HELD}")

    if len(egress_keys) > 1:
        raise fail(egress_keys[1], "one rule holds two egress verbs; write each as its own list item")
    key = egress_keys[0]
    words = key.lower().split()
    if len(words) != 2 or words[1] != "egress" or words[0] not in _VERBS:
        raise fail(key, f'unknown egress rule "{key}"; write "deny egress: remote" or "allow egress: remote"')
    value = item[key]
    if not isinstance(value, str) or value.strip().lower() != _SCOPE:
        raise fail(key, f'"{key}" takes "{_SCOPE}", not {_show(value)}')

    for other in item:
        if other != key and other not in ("paths", "machines") and other not in _NOTE_KEYS:
            raise fail(
                str(other), f'unknown key "{other}" in an egress rule; it takes paths: and machines: (lists of globs)'
            )
    paths = _globs(item, "paths", fail)
    if paths is not None:
        paths = tuple(_normalise(p) for p in paths)
    return EgressRule(verb=words[0], line=line_of(key), paths=paths, machines=_globs(item, "machines", fail))


def _globs(item: dict, key: str, fail: Callable[[str, str], ConfigFileError]) -> tuple[str, ...] | None:
    if key not in item:
        return None
    value = item[key]
    if not isinstance(value, list):
        raise fail(key, f"{key} must be a list of globs, not {_show(value)}")
    for number, glob in enumerate(value, start=1):
        if not isinstance(glob, str) or not glob.strip():
            raise fail(key, f"{key} must be a list of globs; item {number} is {_show(glob)}, not a glob")
    return tuple(v.strip() for v in value)


def _normalise(path: str) -> str:
    path = path.strip()
    while path.startswith("./"):
        path = path[2:]
    return path.lstrip("/")


@lru_cache(maxsize=512)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A workspace-relative glob as a regex over POSIX paths.

    ``*``, ``?`` and ``[…]`` stay inside one directory; ``**`` as a whole segment spans any
    number of them. A pattern also covers everything under a directory it matches, so
    ``data/private`` and ``data/private/**`` mean the same.
    """
    parts: list[str] = []
    segments = pattern.rstrip("/").split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:[^/]+/)*")
            continue
        parts.append(_segment_regex(segment) + ("" if last else "/"))
    return re.compile("".join(parts) + "(?:/.*)?")


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = segment.find("]", i + 2)  # ``[]`` is no class: a ``]`` right after ``[`` is a member
            if end == -1:
                out.append(re.escape(c))
            else:
                body = segment[i + 1 : end]
                negate = body[:1] in ("!", "^")
                members = "".join(ch if ch == "-" else re.escape(ch) for ch in body[negate:] if ch != "/")
                out.append("[" + ("^" if negate else "") + members + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _display(policy_file: Path) -> str:
    """``.punica/policy.yaml`` as users know it, rather than an absolute path."""
    if policy_file.parent.name == ".punica":
        return f".punica/{policy_file.name}"
    return str(policy_file)


def _show(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    return "a list" if isinstance(value, list) else repr(value)


def _describe(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
