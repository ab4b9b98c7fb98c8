"""A minimal client for the kubelet pod-resources API (`v1.PodResourcesLister/List`).

The kubelet serves gRPC on a unix socket (usually /var/lib/kubelet/pod-resources/kubelet.sock)
and answers which devices each container holds. grpcio carries the call; the few protobuf
messages are decoded here by hand (wire format: varints and length-delimited fields), so no
generated code nor the protobuf package is needed. grpcio is optional: install
`flopwatch[kubernetes]`; the agent refuses to start with a kubelet socket configured and no grpcio.

Messages used (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto):
    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
    ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices { string resource_name = 1; repeated string device_ids = 2; ... }
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

LIST_METHOD = "/v1.PodResourcesLister/List"
#: Device-plugin resources that are GPUs (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...).
GPU_RESOURCE_PREFIXES = ("nvidia.com/",)
WIRE_VARINT, WIRE_FIXED64, WIRE_BYTES, WIRE_FIXED32 = 0, 1, 2, 5


class KubeletError(RuntimeError):
    """The kubelet could not be asked or answered something unreadable; one line for the log."""


def grpc_available() -> bool:
    try:
        import grpc  # noqa: F401
    except ImportError:
        return False
    return True


def fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one protobuf message; bytes for length-delimited."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == WIRE_VARINT:
            value, pos = _varint(data, pos)
        elif wire == WIRE_BYTES:
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise ValueError("length-delimited field runs past the message")
            value, pos = data[pos:pos + length], pos + length
        elif wire == WIRE_FIXED64:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == WIRE_FIXED32:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _strings(message: bytes, number: int) -> list[str]:
    return [value.decode("utf-8", "replace") for n, wire, value in fields(message)
            if n == number and wire == WIRE_BYTES]


def _messages(message: bytes, number: int) -> list[bytes]:
    return [value for n, wire, value in fields(message) if n == number and wire == WIRE_BYTES]


def gpu_devices(response: bytes) -> list[tuple[str, str, str]]:
    """(namespace, pod, device_id) for every GPU device in a ListPodResourcesResponse."""
    out: list[tuple[str, str, str]] = []
    for pod in _messages(response, 1):
        name = next(iter(_strings(pod, 1)), "")
        namespace = next(iter(_strings(pod, 2)), "")
        for container in _messages(pod, 3):
            for devices in _messages(container, 2):
                resource = next(iter(_strings(devices, 1)), "")
                if resource.startswith(GPU_RESOURCE_PREFIXES):
                    out += [(namespace, name, device) for device in _strings(devices, 2)]
    return out


class PodResourcesClient:
    """Calls List on the kubelet's unix socket; raises KubeletError with a one-line reason."""

    def __init__(self, socket_path: str, timeout: float = 2.0) -> None:
        import grpc

        self.socket_path = socket_path
        self.timeout = timeout
        self._grpc = grpc
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._list = self._channel.unary_unary(LIST_METHOD)  # bytes in, bytes out

    def list_gpu_devices(self) -> list[tuple[str, str, str]]:
        try:
            response = self._list(b"", timeout=self.timeout)
        except self._grpc.RpcError as error:
            code = error.code().name if hasattr(error, "code") else "error"
            raise KubeletError(f"kubelet pod-resources at {self.socket_path}: {code}; check "
                               "attribution.kubelet_socket and that the agent may read it") from None
        try:
            return gpu_devices(response)
        except ValueError as error:
            raise KubeletError(f"kubelet pod-resources at {self.socket_path}: unreadable answer "
                               f"({error})") from None

    def close(self) -> None:
        self._channel.close()
