"""Attribution through the kubelet pod-resources socket.

No kubelet can run here: a real gRPC server (grpcio) on a unix socket in a temporary directory
stands in for it, answering `v1.PodResourcesLister/List` with protobuf bytes encoded by this test
from the documented message layout. The client, the channel and the wire are real.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flopwatch.exporters.attribution import AttributionCollector, GpuProcesses, JobClaim
from flopwatch.exporters.attribution_kubelet import fields, gpu_devices

try:
    import grpc
except ImportError:  # a failure, not a skip: the test extras pin grpcio
    pytest.fail("grpcio is missing: install the test extras (pip install -e '.[test]')", pytrace=False)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def message(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


def pod(namespace: str, name: str, devices: list[tuple[str, list[str]]]) -> bytes:
    container = message(1, "trainer") + b"".join(
        message(2, message(1, resource) + b"".join(message(2, d) for d in ids)) for resource, ids in devices)
    container += varint(3 << 3 | 2) + varint(2) + bytes([4, 5])  # packed cpu_ids: skipped
    return message(1, message(1, name) + message(2, namespace) + message(3, container))


RESPONSE = (
    pod("ml", "llm-70b-0", [("nvidia.com/gpu", ["GPU-aaa", "GPU-bbb"]), ("example.com/nic", ["mlx5_0"])])
    + pod("research", "sweep-3", [("nvidia.com/gpu", ["GPU-ccc::1"])])        # time-slicing replica
    + pod("research", "tiny", [("nvidia.com/mig-1g.10gb", ["MIG-0d3f"])])     # MIG slice
    + pod("web", "api", [])
)


@pytest.fixture
def kubelet(tmp_path: Path):
    socket_path = tmp_path / "kubelet.sock"
    calls: list[bytes] = []

    def list_pods(request: bytes, context) -> bytes:
        calls.append(request)
        return RESPONSE

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(list_pods)})])
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    yield socket_path, calls
    server.stop(grace=None)


GPUS = [GpuProcesses(0, "GPU-aaa"), GpuProcesses(1, "GPU-bbb"), GpuProcesses(2, "GPU-ccc"),
        GpuProcesses(3, "GPU-ddd")]


def test_decode_list_response():
    assert gpu_devices(RESPONSE) == [("ml", "llm-70b-0", "GPU-aaa"), ("ml", "llm-70b-0", "GPU-bbb"),
                                     ("research", "sweep-3", "GPU-ccc::1"), ("research", "tiny", "MIG-0d3f")]


def test_decoder_rejects_truncated_messages():
    with pytest.raises(ValueError):
        list(fields(RESPONSE[:-3]))


def test_pods_claim_gpus_by_uuid(kubelet):
    socket_path, calls = kubelet
    collector = AttributionCollector("n1", lambda: GPUS, procfs_root=None, kubelet_socket=str(socket_path))
    try:
        assert collector.update() == 0
        assert calls == [b""]
        assert collector.claims() == {0: [JobClaim("ml/llm-70b-0", "ml")], 1: [JobClaim("ml/llm-70b-0", "ml")],
                                      2: [JobClaim("research/sweep-3", "research")]}
        skipped = {(s.labels["source"], s.labels["reason"]): s.value for family in collector.collect()
                   if family.name == "flopwatch_job_attribution_skipped" for s in family.samples}
        assert skipped == {("kubelet", "unknown_device"): 1}  # the MIG slice: see docs
    finally:
        collector.close()


def test_unreachable_kubelet_counts_an_error(tmp_path):
    collector = AttributionCollector("n1", lambda: GPUS, procfs_root=None,
                                     kubelet_socket=str(tmp_path / "nothing.sock"))
    try:
        assert collector.update() == 1
        assert collector.claims() == {}
    finally:
        collector.close()


def test_agent_refuses_a_kubelet_socket_without_grpcio(monkeypatch, tmp_path):
    from flopwatch import config as cfg
    from flopwatch.errors import UsageError
    from flopwatch.exporters import attribution_kubelet
    from flopwatch.exporters.wiring import build_agent

    monkeypatch.setattr(attribution_kubelet, "grpc_available", lambda: False)
    config = cfg.load(overrides={"backend": "sim", "attribution.kubelet_socket": str(tmp_path / "k.sock")},
                      environ={})
    with pytest.raises(UsageError, match=r"needs grpcio: pip install 'flopwatch\[kubernetes\]'"):
        build_agent(config)
