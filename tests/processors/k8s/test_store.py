"""The pod cache: indexes, deleted pods kept for late data, names reused by StatefulSets."""

from __future__ import annotations

from support.clock import Clock

from gputally.processors.k8s.model import KeyFilter, OwnerRef, PodInfo, pod_from_json
from gputally.processors.k8s.store import PodStore

from .helpers import cid, pod_json


def pod(name: str, uid: str, *, containers: dict[str, str] | None = None, **kw: object) -> PodInfo:
    return pod_from_json(pod_json(name, uid=uid, containers=containers, **kw),  # type: ignore[arg-type]
                         labels=KeyFilter([]), annotations=KeyFilter([]))


def test_pod_from_json_keeps_only_what_attribution_needs() -> None:
    obj = pod_json("p", uid="u1", owner=("ReplicaSet", "web-1", "rs"), containers={"main": cid("m")},
                   labels={"team": "ml", "big": "x" * 1000})
    obj["status"]["initContainerStatuses"] = [{"name": "init", "containerID": f"cri-o://{cid('i')}"}]
    obj["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"containerID": f"containerd://{cid('old')}"}}
    info = pod_from_json(obj, labels=KeyFilter(["team"]), annotations=KeyFilter([]))
    assert (info.uid, info.name, info.namespace, info.node) == ("u1", "p", "ml", "node-a")
    assert info.owner == OwnerRef(kind="ReplicaSet", name="web-1", uid="rs", api_version="apps/v1")
    assert info.labels == (("team", "ml"),)
    assert dict(info.containers) == {cid("m"): "main", cid("old"): "main", cid("i"): "init"}


def test_indexes_follow_updates() -> None:
    store = PodStore(grace=60, max_deleted=10)
    store.upsert(pod("a", "u1", containers={"main": cid("1")}))
    assert store.by_container(cid("1")).uid == "u1"  # type: ignore[union-attr]
    store.upsert(pod("a", "u1", containers={"main": cid("2")}))  # restarted: new container id
    assert store.by_container(cid("1")) is None and store.by_container(cid("2")).uid == "u1"  # type: ignore[union-attr]
    assert store.by_name("ml", "a").uid == "u1"  # type: ignore[union-attr]
    assert [p.uid for p in store.on_node("node-a")] == ["u1"]


def test_an_unchanged_update_keeps_the_cached_encodings() -> None:
    store = PodStore(grace=60, max_deleted=10)
    first = store.upsert(pod("a", "u1", containers={"main": cid("1")}))
    first.blobs["k"] = "cached"
    again = store.upsert(pod("a", "u1", containers={"main": cid("1")}))
    assert again is first and first.blobs == {"k": "cached"}
    changed = store.upsert(pod("a", "u1", containers={"main": cid("2")}))
    assert changed is not first and changed.blobs == {}


def test_a_deleted_pod_attributes_late_data_for_its_grace_then_goes() -> None:
    clock = Clock()
    store = PodStore(grace=60, max_deleted=10, clock=clock)
    store.upsert(pod("a", "u1", containers={"main": cid("1")}))
    store.delete("u1")
    assert len(store) == 0 and store.deleted_count == 1
    assert store.get("u1") is not None and store.by_container(cid("1")) is not None
    clock.now += 59
    assert store.expire() == 0
    clock.now += 2
    assert store.expire() == 1
    assert store.get("u1") is None and store.by_container(cid("1")) is None and store.by_name("ml", "a") is None


def test_a_reused_name_points_at_the_new_pod_even_while_the_old_one_lingers() -> None:
    clock = Clock()
    store = PodStore(grace=60, max_deleted=10, clock=clock)
    store.upsert(pod("web-0", "old"))
    store.delete("old")
    store.upsert(pod("web-0", "new"))
    assert store.by_name("ml", "web-0").uid == "new"  # type: ignore[union-attr]
    clock.now += 61
    store.expire()
    assert store.by_name("ml", "web-0").uid == "new"  # type: ignore[union-attr]


def test_deleted_pods_are_bounded_oldest_first() -> None:
    store = PodStore(grace=60, max_deleted=2)
    for i in range(3):
        store.upsert(pod(f"p{i}", f"u{i}"))
        store.delete(f"u{i}")
    assert store.get("u0") is None and store.get("u1") is not None and store.get("u2") is not None


def test_zero_grace_forgets_at_once() -> None:
    store = PodStore(grace=0, max_deleted=10)
    store.upsert(pod("a", "u1", containers={"main": cid("1")}))
    store.delete("u1")
    assert store.get("u1") is None and store.by_container(cid("1")) is None


def test_retain_after_a_relist_retires_pods_deleted_while_unwatched() -> None:
    store = PodStore(grace=60, max_deleted=10)
    for i in range(3):
        store.upsert(pod(f"p{i}", f"u{i}"))
    retired = store.retain(["u0", "u2"])
    assert [p.uid for p in retired] == ["u1"]
    assert store.live_uids() == {"u0", "u2"} and store.get("u1") is not None  # still in its grace
    store.upsert(pod("p1", "u1"))  # a relist that finds it again brings it back
    assert store.live_uids() == {"u0", "u1", "u2"} and store.deleted_count == 0


def test_owner_index() -> None:
    store = PodStore(grace=60, max_deleted=10)
    store.upsert(pod("a", "u1", owner=("ReplicaSet", "rs", "rs-uid")))
    store.upsert(pod("b", "u2", owner=("ReplicaSet", "rs", "rs-uid")))
    store.upsert(pod("c", "u3"))
    assert sorted(p.uid for p in store.owned_by("rs-uid")) == ["u1", "u2"]
