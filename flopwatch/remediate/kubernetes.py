"""Kubernetes through its API: a drain is a cordon (`spec.unschedulable: true`) plus a NoSchedule
taint `<taint_key>=flopwatch` and the reason in the annotation `<taint_key>-reason`; a return
removes all three. Pods keep running (FlopWatch never evicts). The node list is the store, as
Slurm's reasons are: a node FlopWatch cordoned carries its annotation, starting `flopwatch:`.

Requests go through a `Transport` (method, path, JSON body) -> JSON: in a pod, the API server at
KUBERNETES_SERVICE_HOST with the service account's token and CA. Needs `get`, `list` and `patch`
on `nodes` (docs/remediation.md has the ClusterRole).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flopwatch.remediate.scheduler import NodeState, SchedulerError, check_node_name

Transport = Callable[[str, str, "Mapping[str, Any] | None"], Any]
ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"


class Kubernetes:
    name = "kubernetes"

    def __init__(self, transport: Transport, taint_key: str = "flopwatch.io/remediation") -> None:
        self.transport = transport
        self.taint_key = taint_key

    @property
    def annotation(self) -> str:
        return f"{self.taint_key}-reason"

    @classmethod
    def in_cluster(cls, timeout: float, taint_key: str) -> Kubernetes:
        return cls(api_transport(timeout), taint_key)

    def nodes(self) -> dict[str, NodeState]:
        found = {}
        for item in self.transport("GET", "/api/v1/nodes", None).get("items", []):
            name = item.get("metadata", {}).get("name", "")
            reason = (item.get("metadata", {}).get("annotations") or {}).get(self.annotation, "")
            cordoned = bool(item.get("spec", {}).get("unschedulable"))
            found[name] = NodeState(name, cordoned, reason if cordoned else "", ())
        return found

    def _node(self, node: str) -> dict[str, Any]:
        check_node_name(node)
        return self.transport("GET", f"/api/v1/nodes/{node}", None)

    def drain(self, node: str, reason: str) -> None:
        taints = [t for t in self._node(node).get("spec", {}).get("taints") or [] if t.get("key") != self.taint_key]
        taints.append({"key": self.taint_key, "value": "flopwatch", "effect": "NoSchedule"})
        self.transport("PATCH", f"/api/v1/nodes/{node}", {
            "metadata": {"annotations": {self.annotation: reason}},
            "spec": {"unschedulable": True, "taints": taints}})

    def resume(self, node: str) -> None:
        taints = [t for t in self._node(node).get("spec", {}).get("taints") or [] if t.get("key") != self.taint_key]
        self.transport("PATCH", f"/api/v1/nodes/{node}", {
            "metadata": {"annotations": {self.annotation: None}},
            "spec": {"unschedulable": None, "taints": taints or None}})

    def describe(self, action: str, node: str, reason: str = "") -> str:
        if action == "drain":
            return (f"kubectl cordon {node} && kubectl taint node {node} {self.taint_key}=flopwatch:NoSchedule && "
                    f"kubectl annotate node {node} {self.annotation}=\"{reason}\"")
        return (f"kubectl uncordon {node} && kubectl taint node {node} {self.taint_key}- && "
                f"kubectl annotate node {node} {self.annotation}-")


def api_transport(timeout: float) -> Transport:
    """Requests to the API server of the pod's own cluster, as its service account."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise SchedulerError("failed", "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is unset)")
    context = ssl.create_default_context(cafile=str(ACCOUNT / "ca.crt"))

    def send(method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        token = (ACCOUNT / "token").read_text().strip()   # re-read: projected tokens rotate
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), MERGE_PATCH
        request = urllib.request.Request(f"https://{host}:{port}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as error:
            kind = "unknown_node" if error.code == 404 else "failed"
            raise SchedulerError(kind, f"{method} {path}: HTTP {error.code}") from None
        except TimeoutError:
            raise SchedulerError("timeout", f"{method} {path}: no answer in {timeout:g}s") from None
        except (urllib.error.URLError, OSError) as error:
            raise SchedulerError("failed", f"{method} {path}: {error}") from None

    return send

