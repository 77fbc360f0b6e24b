"""The ledger on disk, so counters survive a restart with their original start times.

One JSON file per processor ID, replaced atomically (written beside, fsynced, renamed), so
a crash mid-write leaves the previous state. Samples still settling are not saved: after a
restart the first new sample of each GPU is integrated from the last saved one (within
``max_gap``), so that time is counted once, with the new sample's utilization.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from .ledger import Account, Device, Ledger, OwnerState
from .owners import Owner, owner
from .storage_serving import restore, saved

__all__ = ["LedgerFile"]

log = logging.getLogger(__name__)

_VERSION = 1
_ACCOUNT_FIELDS = tuple(f.name for f in fields(Account))


def _owner(pair: list[str]) -> Owner:
    return owner(str(pair[0]), str(pair[1]))


def _pairs(attributes: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((str(k), v) for k, v in attributes)


class LedgerFile:
    """Where one processor's ledger lives: ``<storage>/usage-<id>.json``."""

    def __init__(self, directory: Path, component_id: str) -> None:
        self.path = directory / f"usage-{re.sub(r'[^A-Za-z0-9_.-]', '_', component_id)}.json"

    def save(self, ledger: Ledger) -> None:
        state = {
            "version": _VERSION,
            "start_ns": ledger.start_ns,
            "instance": ledger.instance,
            "watermark": ledger.watermark,
            "devices": {
                hw_id: {
                    "start_ns": d.start_ns, "attributes": list(d.attributes), "last_ns": d.last_ns,
                    "energy": d.energy, "limit": d.limit, "observed": d.observed, "unobserved": d.unobserved,
                    "unattributed": d.unattributed, "announced": d.announced,
                    "accounts": [[o.kind, o.id, asdict(a)] for o, a in d.accounts.items()],
                }
                for hw_id, d in ledger.devices.items()
            },
            "owners": [
                [o.kind, o.id, {"attributes": s.attributes, "first_ns": s.first_ns, "last_ns": s.last_ns,
                                "gpus": sorted(s.gpus)}]
                for o, s in ledger.owners.items()
            ],
            "serving": saved(ledger),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".json.partial")
        with open(partial, "w", encoding="utf-8") as out:
            json.dump(state, out, separators=(",", ":"))
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.path)

    def load(self, ledger: Ledger) -> bool:
        """Fill ``ledger`` from the file; False when there is none. A file that cannot be read
        is set aside (``.corrupt``) with one error line, and counting starts anew."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return False
        try:
            state = json.loads(text)
            if state.get("version") != _VERSION:
                raise ValueError(f"version {state.get('version')!r}, expected {_VERSION}")
            devices: dict[str, Device] = {}
            for hw_id, d in state["devices"].items():
                device = Device(
                    start_ns=int(d["start_ns"]), attributes=_pairs(d["attributes"]), last_ns=d["last_ns"],
                    energy=d["energy"], limit=d["limit"], observed=float(d["observed"]),
                    unobserved=float(d["unobserved"]), announced=bool(d.get("announced", False)),
                    unattributed={str(k): float(v) for k, v in d.get("unattributed", {}).items()},
                )
                for kind, owner_id, account in d["accounts"]:
                    device.accounts[_owner([kind, owner_id])] = Account(**{k: account[k] for k in _ACCOUNT_FIELDS
                                                                         if k in account})
                devices[str(hw_id)] = device
            owners = {
                _owner(entry[:2]): OwnerState(
                    attributes=dict(entry[2]["attributes"]), first_ns=int(entry[2]["first_ns"]),
                    last_ns=int(entry[2]["last_ns"]), gpus=set(entry[2]["gpus"]),
                )
                for entry in state["owners"]
            }
            serving, models = restore(ledger, state.get("serving"), start_ns=int(state["start_ns"]))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            aside = self.path.with_suffix(".json.corrupt")
            os.replace(self.path, aside)
            log.error("usage state %s cannot be read (%s); moved to %s, counting starts anew", self.path, exc, aside)
            return False
        ledger.start_ns = int(state["start_ns"])
        ledger.instance = str(state.get("instance") or ledger.instance)
        ledger.watermark = int(state.get("watermark", 0))
        ledger.devices, ledger.owners = devices, owners
        ledger.serving, ledger.models = serving, models
        return True
