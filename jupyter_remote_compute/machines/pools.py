"""compute.yaml's ``pools:``: each pool's machines and placement rule, checked as people write them and
written back with comments kept (the same round trip as the machines: yaml_document.py).

    pools:
      gpus:                 # a name of the machines' kind, never a machine's name
        machines: [a, b]    # at least one, each a machine of this file (or local)
        placement: first    # first | least_loaded | cheapest (default: first)

A pool and a machine never share a name, so a job names either where it names a machine
(``--machine gpus``) without a prefix; the registry refuses a clash from either side.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticCustomError
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from ..errors import Conflict, InvalidSettings, NotFound
from ..schema.pool import Pool, PoolInput, _machines, _rule
from .options import LOCAL, NAME_RE, NAME_RULE
from .yaml_document import (
    YamlDocument,
    append_entry,
    delete_entry,
    keeping_tail,
    plain,
    put_following,
    take_following,
)

#: What a pool's entry may hold.
POOL_FIELDS = ("machines", "placement")


def check_pools(doc: YamlDocument) -> None:
    """``pools:`` as a person may have written it: errors name the line, the pool and the field."""
    root = doc.root
    if root is None or root.get("pools") is None:
        return
    pools = root["pools"]
    if not isinstance(pools, CommentedMap):
        raise doc.error(doc.line(root, "pools", value=True), "'pools' must map pool names to settings")
    doc.pools = pools
    for name, entry in pools.items():
        at = doc.line(pools, name)
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise doc.error(at, f"pool name {str(name)!r} is not valid: a name must be {NAME_RULE}")
        if name == LOCAL or (doc.machines is not None and name in doc.machines):
            raise doc.error(at, f"pool {name!r} has a machine's name: a job could not tell them apart; rename one")
        if not isinstance(entry, CommentedMap):
            raise doc.error(doc.line(pools, name, value=True), f"pool {name!r} must be a mapping with machines:")
        for key in entry:
            if key not in POOL_FIELDS:
                problem = f"pool {name!r}: unknown setting {key!r}; use machines or placement"
                raise doc.error(doc.line(entry, key), problem)
        if "machines" not in entry:
            raise doc.error(at, f"pools.{name}.machines: a pool needs at least one machine")
        for key, check in (("machines", _machines), ("placement", _rule)):
            if key not in entry:
                continue
            try:
                value = check(plain(entry[key]))
            except PydanticCustomError as e:
                context = e.context or {}
                index = context.get("at")
                field = f"pools.{name}.{key}" + (f"[{index}]" if index is not None else "")
                raise doc.error(doc.line(entry, key, value=True), f"{field}: {context.get('message')}") from None
            if key == "machines":
                for i, machine in enumerate(value):
                    if machine != LOCAL and (doc.machines is None or machine not in doc.machines):
                        line = _item_line(doc, entry["machines"], i)
                        raise doc.error(line, f"pools.{name}.machines[{i}]: no machine named {machine!r} in this file")


def _item_line(doc: YamlDocument, seq: Any, index: int) -> int:
    try:
        return seq.lc.item(index)[0] + 1 + doc.line_offset
    except (AttributeError, KeyError, TypeError, IndexError):
        return getattr(getattr(seq, "lc", None), "line", 0) + 1 + doc.line_offset


def pools_of(doc: YamlDocument) -> list[Pool]:
    """The file's pools, in file order (checked by ``check_pools`` when the file was read)."""
    return [pool_of(doc, name) for name in (doc.pools or {})]


def pool_of(doc: YamlDocument, name: str) -> Pool:
    if doc.pools is None or name not in doc.pools:
        raise NotFound(f"no pool named {name!r} in {doc.path}")
    entry = doc.pools[name]
    return Pool(name=name, machines=tuple(plain(entry["machines"])), placement=str(entry.get("placement") or "first"))


def put_pool(doc: YamlDocument, name: str, given: PoolInput) -> Pool:
    """Make pool ``name`` or replace its machines and rule; its comments and the file's others stay."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidSettings(f"a pool name must be {NAME_RULE}", field="name")
    if name == LOCAL or (doc.machines is not None and name in doc.machines):
        raise Conflict(f"a machine is named {name!r}: a pool cannot have a machine's name", field="name")
    for i, machine in enumerate(given.machines):
        if machine != LOCAL and (doc.machines is None or machine not in doc.machines):
            field = f"machines[{i}]"
            raise InvalidSettings(f"{field}: no machine named {machine!r}; add it first", field=field)
    assert doc.root is not None  # the caller made the document's machines first
    if doc.pools is None:
        # Comment lines after the file's last entry stay last: they go after the new pool.
        last = "pools" if "pools" in doc.root else next(reversed(doc.root))
        following = take_following(doc.root, last)
        doc.root["pools"] = doc.pools = CommentedMap()
        doc.pools[name] = _entry(given)
        put_following(doc.pools, name, following)
        return pool_of(doc, name)
    if name in doc.pools:
        entry = doc.pools[name]
        with keeping_tail(doc.pools, name):
            if list(plain(entry["machines"])) != list(given.machines):
                entry["machines"] = _flow(given.machines)
            if str(entry.get("placement") or "first") != given.placement:
                entry["placement"] = given.placement
    else:
        append_entry(doc.pools, name, _entry(given))
    return pool_of(doc, name)


def remove_pool(doc: YamlDocument, name: str) -> None:
    if doc.pools is None or name not in doc.pools or doc.root is None:
        raise NotFound(f"no pool named {name!r} in {doc.path}")
    delete_entry(doc.root, "pools", doc.pools, name)
    if not doc.pools:
        doc.root["pools"] = None  # as for machines: a null carries the comments that followed


def pools_with(doc: YamlDocument, machine: str) -> list[str]:
    """The pools that list ``machine``."""
    return [name for name, entry in (doc.pools or {}).items() if machine in plain(entry["machines"])]


def _entry(given: PoolInput) -> CommentedMap:
    entry = CommentedMap()
    entry["machines"] = _flow(given.machines)
    entry["placement"] = given.placement
    return entry


def _flow(names: tuple[str, ...]) -> CommentedSeq:
    """``[a, b]`` on one line, as a person writes a short list."""
    seq = CommentedSeq(names)
    seq.fa.set_flow_style()
    return seq
