"""The usage counters as FOCUS 1.3 cost and usage rows: one per owner x GPU x charge period.

FOCUS (the FinOps Foundation's billing-data specification) has, since 1.3, a way to say that
a charge was split among the things that used a resource: the *origin charge* (here: one
GPU's cost over one charge period, its time at the model's price plus its energy) is given
as *allocated charges*, one per owner, with ``AllocatedMethodId`` naming how the split was
made and ``AllocatedResourceId`` naming what it went to. gputally's split rules are exactly
that (processors/usage/README.md): a GPU's time goes to the owners that held it (``unallocated``
when nobody did), its energy to whoever computed. So every (owner, GPU) account of a period
is one row, the ``unallocated`` and ``unattributed`` accounts included, and a period's rows
add up to its GPUs' full cost.

Row by row (the README's table says where each column comes from):

* ``AllocatedMethodId`` is ``gputally-allocated-time`` for an account with allocated time
  (its cost is its share of the GPU's time and the energy of its work), else
  ``gputally-busy-time`` (work on a GPU it did not hold: the ``unattributed`` owner, or a
  Slurm job's process on a pod's GPU; its cost is the energy of that work).
  ``ConsumedQuantity`` and ``PricingQuantity`` are the GPU-hours of that method.
* ``AllocatedResourceId`` is the pod's uid or the Slurm job id; null for the unallocated and
  unattributed rows, as FOCUS wants for the part of an origin charge that went to nobody.
* ``Tags`` are the GPU's (the charge's resource), ``AllocatedTags`` the owner's: namespace,
  workload, pod labels, Slurm account, partition and user. FOCUS 1.3 forbids repeating a
  resource tag in ``AllocatedTags``, so the two never share a key.
* Costs: the usage counters hold one figure per account (time at the price plus energy),
  and all four FOCUS costs are that figure: gputally knows no discounts or commitments.
  The unit prices are the row's cost per GPU-hour of its quantity, so that
  ``ListCost = ListUnitPrice x PricingQuantity`` (to the rounding of the columns).

Costs are rounded to ``decimals`` places by `money.apportion`, per period and currency: the
period's total among its GPUs, then each GPU's share among its rows, so that they add up.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from . import money
from .periods import Period, billing_month
from .queries import Account
from .timerange import format_time

__all__ = ["COLUMNS", "METHOD_ALLOCATED", "METHOD_BUSY", "Column", "Identity", "rows"]

METHOD_ALLOCATED = "gputally-allocated-time"
METHOD_BUSY = "gputally-busy-time"
UNIT = "GPU-Hours"
QUANTITY = money.quantum(9)
"""GPU-hours to 9 decimals (3.6 microseconds)."""
PRICE = money.quantum(10)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    """``string``, ``decimal``, ``datetime`` or ``json`` (a JSON object serialised as a string)."""


def _columns(text: str) -> tuple[Column, ...]:
    out = []
    for item in text.split():
        name, _, kind = item.partition(":")
        out.append(Column(name, kind or "string"))
    return tuple(out)


COLUMNS: tuple[Column, ...] = _columns("""
    AllocatedMethodDetails:json AllocatedMethodId AllocatedResourceId AllocatedResourceName AllocatedTags:json
    AvailabilityZone BilledCost:decimal BillingAccountId BillingAccountName BillingAccountType BillingCurrency
    BillingPeriodEnd:datetime BillingPeriodStart:datetime ChargeCategory ChargeClass ChargeDescription ChargeFrequency
    ChargePeriodEnd:datetime ChargePeriodStart:datetime CommitmentDiscountCategory CommitmentDiscountId
    CommitmentDiscountName CommitmentDiscountStatus CommitmentDiscountType ConsumedQuantity:decimal ConsumedUnit
    ContractedCost:decimal ContractedUnitPrice:decimal EffectiveCost:decimal HostProviderName InvoiceId
    InvoiceIssuerName ListCost:decimal ListUnitPrice:decimal PricingCategory PricingQuantity:decimal PricingUnit
    ProviderName PublisherName RegionId RegionName ResourceId ResourceName ResourceType ServiceCategory ServiceName
    ServiceProviderName ServiceSubcategory SkuId SkuMeter SkuPriceDetails:json SkuPriceId SubAccountId
    SubAccountName SubAccountType Tags:json
    x_GputallyOwnerKind x_GputallyInstance x_BusyGpuHours:decimal x_IdleGpuHours:decimal x_EnergyKwh:decimal
""")
"""The FOCUS 1.3 cost and usage columns this export writes, in alphabetical order (as the
specification lists them), then gputally's own (``x_`` prefixed, as FOCUS requires of custom
columns). ``ProviderName`` and ``PublisherName`` are deprecated by 1.3 in favour of
``ServiceProviderName`` and ``HostProviderName`` but still required; conditional columns whose
condition gputally never meets (capacity reservations, contract commitments, a pricing
currency other than the billing currency, commitment discount quantities) are left out."""

_OWNER_TAGS = {
    "k8s_namespace_name": "gputally/namespace",
    "k8s_pod_name": "gputally/pod",
    "gputally_k8s_owner_kind": "gputally/workload-kind",
    "gputally_k8s_owner_name": "gputally/workload",
    "slurm_cluster_name": "gputally/slurm-cluster",
    "slurm_job_name": "gputally/slurm-job-name",
    "slurm_job_user": "gputally/slurm-user",
    "slurm_job_account": "gputally/slurm-account",
    "slurm_job_partition": "gputally/slurm-partition",
    "slurm_job_qos": "gputally/slurm-qos",
}
"""Owner label -> AllocatedTags key. gputally's own tags carry the ``gputally/`` prefix (FOCUS:
data generator-defined keys are prefixed); pod labels (``k8s_pod_label_<key>``) are the
users' own and keep their key."""
_POD_LABEL = "k8s_pod_label_"
_GPU_TAGS = {
    "host_name": "gputally/host",
    "k8s_node_name": "gputally/k8s-node",
    "gputally_gpu_index": "gputally/gpu-index",
    "hw_model": "gputally/gpu-model",
    "host_type": "gputally/host-type",
}
"""GPU label -> Tags key."""
_SPECIAL = {"unallocated": "GPU time nobody held (idle capacity)",
            "unattributed": "GPU work of processes no owner rule named"}


@dataclass(frozen=True, slots=True)
class Identity:
    """Who runs the GPUs, for the columns that name the provider and the billing account
    (flags of ``report``: gputally cannot know them)."""

    provider: str = "GPU cluster"
    billing_account: str = "gpu-cluster"


def _hours(seconds: float) -> Decimal:
    return (money.exact(seconds) / 3600).quantize(QUANTITY)


def _json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(dict(value), sort_keys=True, separators=(",", ":"))


def _owner_tags(account: Account) -> dict[str, str] | None:
    if account.kind in _SPECIAL:
        return None
    tags = {"gputally/owner-kind": account.kind}
    for label, key in _OWNER_TAGS.items():
        if account.labels.get(label):
            tags[key] = account.labels[label]
    for label, value in account.labels.items():
        if label.startswith(_POD_LABEL) and value:
            tags[label.removeprefix(_POD_LABEL)] = value
    return tags


def _gpu_tags(account: Account) -> dict[str, str]:
    tags = {key: account.labels[label] for label, key in _GPU_TAGS.items() if account.labels.get(label)}
    tags["gputally/gpu"] = account.hw_id
    return tags


def _owner_name(account: Account) -> str:
    namespace, pod = account.labels.get("k8s_namespace_name"), account.labels.get("k8s_pod_name")
    if account.kind == "k8s.pod" and namespace and pod:
        return f"{namespace}/{pod}"
    if account.kind == "slurm.job":
        name = account.labels.get("slurm_job_name")
        return f"Slurm job {account.owner}" + (f" ({name})" if name else "")
    return account.owner


def _sub_account(account: Account) -> tuple[str | None, str | None]:
    if account.kind == "k8s.pod" and account.labels.get("k8s_namespace_name"):
        return account.labels["k8s_namespace_name"], "Kubernetes Namespace"
    if account.kind == "slurm.job" and account.labels.get("slurm_job_account"):
        return account.labels["slurm_job_account"], "Slurm Account"
    return None, None


def _gpu_name(account: Account) -> str:
    host = account.labels.get("host_name") or account.labels.get("k8s_node_name")
    index = account.labels.get("gputally_gpu_index")
    if host and index:
        return f"{host} GPU {index}"
    return host or account.hw_id


@dataclass(slots=True)
class _Line:
    """One (owner, GPU, currency) of a period before its cost is rounded."""

    account: Account
    currency: str
    share: float
    """The part of the account's quantities this currency's row carries (1 unless the
    account was charged in several currencies in the period)."""
    cost: Decimal


def _merged(accounts: Iterable[Account]) -> list[Account]:
    """One account per (owner kind, owner, GPU): a GPU counted by two gputally instances in one
    period (moved in a scale-out) is still one resource."""
    out: dict[tuple[str, str, str], Account] = {}
    for account in accounts:
        key = (account.kind, account.owner, account.hw_id)
        seen = out.get(key)
        if seen is None:
            out[key] = Account(account.instance, account.kind, account.owner, account.hw_id, dict(account.labels),
                               account.allocated, account.busy, account.idle, account.energy, dict(account.cost))
            continue
        seen.labels.update(account.labels)
        seen.allocated += account.allocated
        seen.busy += account.busy
        seen.idle += account.idle
        seen.energy += account.energy
        for currency, amount in account.cost.items():
            seen.cost[currency] = seen.cost.get(currency, 0.0) + amount
    return [a for a in out.values() if a.allocated or a.busy or a.energy or any(a.cost.values())]


def _lines(accounts: Sequence[Account], fallback: str) -> list[_Line]:
    lines = []
    for account in accounts:
        costs = {c: v for c, v in account.cost.items() if c}
        if not costs:
            lines.append(_Line(account, fallback, 1.0, Decimal(0)))
            continue
        total = sum(costs.values())
        for currency, amount in sorted(costs.items()):
            share = amount / total if total > 0 else 1.0 / len(costs)
            lines.append(_Line(account, currency, share, money.exact(amount)))
    return lines


def _rounded(lines: Sequence[_Line], decimals: int) -> dict[int, Decimal]:
    """id(line) -> its cost rounded so that, per currency, the GPUs' shares add up to the
    period's rounded total and each GPU's rows to its share."""
    unit = money.quantum(decimals)
    out: dict[int, Decimal] = {}
    for currency in sorted({line.currency for line in lines}):
        gpus: dict[str, list[_Line]] = {}
        for line in lines:
            if line.currency == currency:
                gpus.setdefault(line.account.hw_id, []).append(line)
        order = sorted(gpus)
        exact = [sum((line.cost for line in gpus[g]), Decimal(0)) for g in order]
        for gpu, amount in zip(order, money.apportion(exact, unit), strict=True):
            parts = money.apportion([line.cost for line in gpus[gpu]], unit, whole=amount)
            for line, part in zip(gpus[gpu], parts, strict=True):
                out[id(line)] = part
    return out


def _ratios(lines: Sequence[_Line]) -> dict[int, float]:
    """id(line) -> its share of its GPU's cost in its currency (of its quantity where the GPU
    cost nothing): AllocatedMethodDetails' AllocatedRatio, which adds up to 1 per GPU."""
    out: dict[int, float] = {}
    groups: dict[tuple[str, str], list[_Line]] = {}
    for line in lines:
        groups.setdefault((line.account.hw_id, line.currency), []).append(line)
    for group in groups.values():
        cost = sum(float(line.cost) for line in group)
        hours = [_quantity_seconds(line) for line in group]
        for line, seconds in zip(group, hours, strict=True):
            if cost > 0:
                out[id(line)] = float(line.cost) / cost
            elif sum(hours) > 0:
                out[id(line)] = seconds / sum(hours)
            else:
                out[id(line)] = 1.0 / len(group)
    return out


def _method(account: Account) -> str:
    return METHOD_ALLOCATED if account.allocated > 0 else METHOD_BUSY


def _quantity_seconds(line: _Line) -> float:
    account = line.account
    return (account.allocated if account.allocated > 0 else account.busy) * line.share


def _who(account: Account) -> str:
    return f"pod {_owner_name(account)}" if account.kind == "k8s.pod" else _owner_name(account)


def _description(account: Account, model: str) -> str:
    if account.kind in _SPECIAL:
        return f"{model}: {_SPECIAL[account.kind]}"
    if account.allocated > 0:
        return f"{model} GPU time held by {_who(account)}"
    return f"{model} GPU work of {_who(account)} on a GPU it did not hold"


def _row(line: _Line, cost: Decimal, ratio: float, period: Period, identity: Identity) -> dict[str, Any]:
    account = line.account
    labels = account.labels
    model = labels.get("hw_model") or "GPU"
    quantity = (money.exact(_quantity_seconds(line)) / 3600).quantize(QUANTITY)
    price = (cost / quantity).quantize(PRICE) if quantity > 0 else Decimal(0)
    owned = account.kind not in _SPECIAL
    sub_id, sub_type = _sub_account(account)
    month = billing_month(period.start)
    details = {"Elements": [{"AllocatedRatio": ratio, "UsageUnit": UNIT, "UsageQuantity": float(quantity)}]}
    return {
        "AllocatedMethodDetails": _json(details),
        "AllocatedMethodId": _method(account),
        "AllocatedResourceId": account.owner if owned else None,
        "AllocatedResourceName": _owner_name(account) if owned else None,
        "AllocatedTags": _json(_owner_tags(account)),
        "AvailabilityZone": labels.get("cloud_availability_zone") or None,
        "BilledCost": cost,
        "BillingAccountId": identity.billing_account,
        "BillingAccountName": identity.billing_account,
        "BillingAccountType": "GPU Cluster",
        "BillingCurrency": line.currency,
        "BillingPeriodEnd": month[1],
        "BillingPeriodStart": month[0],
        "ChargeCategory": "Usage",
        "ChargeClass": None,
        "ChargeDescription": _description(account, model),
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodEnd": period.end,
        "ChargePeriodStart": period.start,
        "CommitmentDiscountCategory": None,
        "CommitmentDiscountId": None,
        "CommitmentDiscountName": None,
        "CommitmentDiscountStatus": None,
        "CommitmentDiscountType": None,
        "ConsumedQuantity": quantity,
        "ConsumedUnit": UNIT,
        "ContractedCost": cost,
        "ContractedUnitPrice": price,
        "EffectiveCost": cost,
        "HostProviderName": labels.get("cloud_provider") or identity.provider,
        "InvoiceId": None,
        "InvoiceIssuerName": identity.provider,
        "ListCost": cost,
        "ListUnitPrice": price,
        "PricingCategory": "Standard",
        "PricingQuantity": quantity,
        "PricingUnit": UNIT,
        "ProviderName": identity.provider,
        "PublisherName": identity.provider,
        "RegionId": labels.get("cloud_region") or None,
        "RegionName": labels.get("cloud_region") or None,
        "ResourceId": account.hw_id,
        "ResourceName": _gpu_name(account),
        "ResourceType": "GPU",
        "ServiceCategory": "Compute",
        "ServiceName": "GPU Compute",
        "ServiceProviderName": identity.provider,
        "ServiceSubcategory": "Other (Compute)",
        "SkuId": model,
        "SkuMeter": "GPU time",
        "SkuPriceDetails": None,
        "SkuPriceId": model,
        "SubAccountId": sub_id,
        "SubAccountName": sub_id,
        "SubAccountType": sub_type,
        "Tags": _json(_gpu_tags(account)),
        "x_GputallyOwnerKind": account.kind,
        "x_GputallyInstance": account.instance or None,
        "x_BusyGpuHours": _hours(account.busy * line.share),
        "x_IdleGpuHours": _hours(account.idle * line.share),
        "x_EnergyKwh": (money.exact(account.energy * line.share) / Decimal(3_600_000)).quantize(QUANTITY),
    }


def rows(periods: Iterable[Period], *, decimals: int = 6, identity: Identity = Identity()) -> list[dict[str, Any]]:
    """The FOCUS rows of ``periods``, by period, then GPU, then owner. Datetimes are unix
    seconds (the writers format them), decimals `Decimal`, JSON columns strings, nulls None."""
    out: list[dict[str, Any]] = []
    periods = list(periods)
    fallback = next((c for p in periods for a in p.usage.accounts for c in sorted(a.cost) if c), "USD")
    for period in periods:
        accounts = sorted(_merged(period.usage.accounts), key=lambda a: (a.hw_id, a.kind in _SPECIAL, a.kind, a.owner))
        lines = _lines(accounts, fallback)
        costs = _rounded(lines, decimals)
        ratios = _ratios(lines)
        out.extend(_row(line, costs[id(line)], ratios[id(line)], period, identity) for line in lines)
    return out


def format_datetime(seconds: float) -> str:
    """FOCUS's date/time format: ISO 8601 in UTC with a Z."""
    return format_time(seconds)
