"""The Kubernetes adapter (flopwatch/remediate/kubernetes.py) at its narrowest seam: no API server
can run here, so the transport is replaced by a node store that applies JSON merge patches
(RFC 7386) the way the API server does for `application/merge-patch+json`. What is checked is what
the adapter asks of the API: the cordon, the taint (others' taints kept), the reason annotation, and
that a return undoes exactly those."""

from __future__ import annotations

from typing import Any

import pytest

from flopwatch.remediate.kubernetes import Kubernetes
from flopwatch.remediate.scheduler import SchedulerError

OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class Store:
    def __init__(self) -> None:
        self.nodes = {"gpu-1": {"metadata": {"name": "gpu-1"}, "spec": {"taints": [OTHER_TAINT]}},
                      "gpu-2": {"metadata": {"name": "gpu-2"}, "spec": {}}}
        self.requests: list[tuple[str, str]] = []

    def __call__(self, method: str, path: str, body: Any) -> Any:
        self.requests.append((method, path))
        if path == "/api/v1/nodes":
            return {"items": list(self.nodes.values())}
        name = path.rsplit("/", 1)[1]
        if name not in self.nodes:
            raise SchedulerError("unknown_node", f"{method} {path}: HTTP 404")
        if method == "PATCH":
            self.nodes[name] = merge(self.nodes[name], body)
        return self.nodes[name]


def test_drain_cordons_taints_and_annotates_and_resume_undoes_exactly_that() -> None:
    store = Store()
    kube = Kubernetes(store)
    kube.drain("gpu-1", "flopwatch: FlopWatchGpuLost GPU 2")
    node = store.nodes["gpu-1"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [OTHER_TAINT, {"key": "flopwatch.io/remediation", "value": "flopwatch",
                                                    "effect": "NoSchedule"}]
    assert kube.nodes()["gpu-1"].ours and not kube.nodes()["gpu-2"].drained
    kube.drain("gpu-1", "flopwatch: FlopWatchGpuLost GPU 2")          # again: still one taint of ours
    assert len(store.nodes["gpu-1"]["spec"]["taints"]) == 2
    kube.resume("gpu-1")
    assert store.nodes["gpu-1"] == {"metadata": {"name": "gpu-1", "annotations": {}}, "spec": {"taints": [OTHER_TAINT]}}
    assert not kube.nodes()["gpu-1"].drained


def test_a_cordon_by_someone_else_is_not_ours_and_unknown_nodes_fail_as_such() -> None:
    store = Store()
    store.nodes["gpu-2"]["spec"]["unschedulable"] = True
    kube = Kubernetes(store)
    assert kube.nodes()["gpu-2"].drained and not kube.nodes()["gpu-2"].ours
    with pytest.raises(SchedulerError) as failed:
        kube.drain("gpu-9", "flopwatch: x")
    assert failed.value.kind == "unknown_node"
    with pytest.raises(SchedulerError):
        kube.drain("gpu-1/../x", "flopwatch: x")                  # never a path of the caller's making
