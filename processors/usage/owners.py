"""Who owns a GPU or a GPU process, named from the attributes ``k8s`` and ``slurm`` wrote.

An owner is a (kind, id) pair: ``("slurm.job", "4242")``, ``("k8s.pod", "<pod uid>")`` (or
``("k8s.pod", "ml/trainer-0")`` for a pod whose uid nobody knew: the fallback key).
Two kinds are reserved: ``unallocated`` owns the time of a GPU nobody holds (OpenCost's idle
capacity) and ``unattributed`` the work of a process no rule names (a system daemon, a
process whose pod the API never showed).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .config import OwnerRule

__all__ = ["NO_CGROUP", "NO_METADATA", "REASONS", "UNALLOCATED", "UNATTRIBUTED", "Owner", "OwnerRules", "Value",
           "owner", "unattributed_reason"]

Value = str | int | float | bool


class Owner(NamedTuple):
    """A tuple, so that hashing it (several times per GPU sample) runs in C."""

    kind: str
    id: str

    def __str__(self) -> str:
        return f"{self.kind} {self.id}"


UNALLOCATED = Owner("unallocated", "unallocated")
UNATTRIBUTED = Owner("unattributed", "unattributed")
_RESERVED = {UNALLOCATED: UNALLOCATED, UNATTRIBUTED: UNATTRIBUTED}


def owner(kind: str, owner_id: str) -> Owner:
    """The owner ``(kind, owner_id)``: the reserved ones as their single instances (compared by identity)."""
    named = Owner(kind, owner_id)
    return _RESERVED.get(named, named)


Named = tuple[Owner, tuple[tuple[str, Value], ...]]
"""An owner and the attributes it was seen with (its key and carried attributes)."""

NO_CGROUP = "no_cgroup"
"""Why a process is ``unattributed``: nothing named its cgroup (not sent, not readable, or
not a pod's or a job's: a system daemon, a process gone before its cgroup was read)."""
NO_METADATA = "no_metadata"
"""Why a process is ``unattributed``: its cgroup named a pod or a job (a uid, a container,
a job id), but not the attributes any rule keys on (a pod or job the metadata never showed)."""
REASONS = (NO_CGROUP, NO_METADATA)

_CGROUP_NAMED = ("k8s.pod.uid", "container.id", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id")
"""Attributes only a process's cgroup (and what it leads to) writes on it."""


def unattributed_reason(attributes: Mapping[str, Any]) -> str:
    """Why no rule named the process with ``attributes``: `NO_METADATA` when the attribution
    processors found its cgroup's pod or job, else `NO_CGROUP`."""
    if attributes.get("gputally.k8s.attribution") == "cgroup" or any(attributes.get(k) for k in _CGROUP_NAMED):
        return NO_METADATA
    return NO_CGROUP


class _Rule:
    __slots__ = ("carry", "fallback", "fields", "key", "kind", "list_key")

    def __init__(self, rule: OwnerRule) -> None:
        self.kind = rule.kind
        self.key = tuple(rule.key)
        self.fallback = tuple(rule.fallback_key)
        self.list_key = rule.list_key
        self.fields = tuple(rule.list_fields or rule.key)
        patterns = rule.carry
        self.carry = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)) if patterns else None

    def named(self, attributes: Mapping[str, Any]) -> Named | None:
        found = _values(self.key, attributes)
        key = self.key
        if found is None and self.fallback:
            found, key = _values(self.fallback, attributes), self.fallback
        if found is None:
            return None
        owner = Owner(self.kind, "/".join(str(v) for v in found))
        carried = [(k, v) for k, v in attributes.items() if self.carry is not None and self.carry.match(k)
                   and not isinstance(v, tuple) and k not in key]
        return owner, tuple(sorted([*zip(key, found, strict=True), *carried]))

    def listed(self, attributes: Mapping[str, Any]) -> list[Named]:
        if self.list_key is None:
            return []
        elements = attributes.get(self.list_key)
        if not isinstance(elements, tuple):
            return []
        named: list[Named] = []
        for element in elements:
            if not isinstance(element, str):
                continue
            parts = element.split("/", len(self.fields) - 1)
            if len(parts) != len(self.fields):
                continue
            values = {field: part for field, part in zip(self.fields, parts, strict=True) if part}
            found = _values(self.key, values)
            if found is None and self.fallback:
                found = _values(self.fallback, values)
            if found is not None:
                owner = Owner(self.kind, "/".join(str(v) for v in found))
                named.append((owner, tuple(sorted(values.items()))))
        return named


def _values(keys: tuple[str, ...], attributes: Mapping[str, Any]) -> list[Any] | None:
    """The values of ``keys``, or None when one is missing, empty or an array."""
    values = [attributes.get(key) for key in keys]
    if any(v is None or v == "" or isinstance(v, tuple) for v in values):
        return None
    return values


class OwnerRules:
    """The configured rules, applied to one resource's attributes (arrays as tuples)."""

    def __init__(self, rules: Sequence[OwnerRule]) -> None:
        self._rules = [_Rule(rule) for rule in rules]

    def process_owner(self, attributes: Mapping[str, Any]) -> Named:
        """The owner of a GPU process: the first rule that names it, else ``unattributed``."""
        for rule in self._rules:
            found = rule.named(attributes)
            if found is not None:
                return found
        return UNATTRIBUTED, ()

    def allocation(self, attributes: Mapping[str, Any]) -> tuple[Named, ...]:
        """Every owner a GPU is allocated to (empty: nobody). Each rule may name one owner by
        its key attributes or several through its array (a shared GPU); both are merged."""
        found: dict[Owner, tuple[tuple[str, Value], ...]] = {}
        for rule in self._rules:
            single = rule.named(attributes)
            if single is not None:
                found[single[0]] = single[1]
            for owner, attrs in rule.listed(attributes):
                found.setdefault(owner, attrs)
        return tuple(sorted(found.items(), key=lambda item: (item[0].kind, item[0].id)))
