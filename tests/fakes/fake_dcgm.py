"""Fake DCGM Python bindings (pydcgm, dcgm_structs, dcgm_fields, dcgm_agent) over a fake host engine.

DCGM and its nv-hostengine need NVIDIA GPUs and a driver, and its bindings are not on PyPI, so
none of it can run here. These modules reproduce the slice of the bindings' API that FlopWatch
uses (as in NVIDIA/DCGM testing/python3: DcgmHandle, DcgmSystem, DcgmGroup.samples.WatchFields /
GetLatest_v2, DcgmFieldGroup, the DCGMError-per-status class hierarchy) and serve profiling values
keyed by numeric field id. `dcgm_fields` deliberately carries no DCGM_FI_PROF_* names: the
backend must key by id (DCGM 4.6 renamed them).

`install(monkeypatch, engine)` puts the four modules into sys.modules, the seam the backend imports.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

ST = {
    "DCGM_ST_OK": 0, "DCGM_ST_BADPARAM": -1, "DCGM_ST_GENERIC_ERROR": -3, "DCGM_ST_NOT_SUPPORTED": -6,
    "DCGM_ST_NO_DATA": -14, "DCGM_ST_CONNECTION_NOT_VALID": -21, "DCGM_ST_LIBRARY_NOT_FOUND": -25,
    "DCGM_ST_REQUIRES_ROOT": -29, "DCGM_ST_PROFILING_NOT_SUPPORTED": -36,
}
DCGM_FE_GPU = 1


@dataclass
class FakeHostEngine:
    """nv-hostengine: GPUs by DCGM id -> UUID, and the latest value of each field (None = blank)."""

    gpus: dict[int, str]
    address: str = "127.0.0.1"
    running: bool = True
    values: dict[int, dict[int, float | None]] = field(default_factory=dict)
    watch_error: int | None = None              # status WatchFields fails with (e.g. profiling unsupported)
    generation: int = 0                          # bumped by restart(): old connections become invalid
    connections: int = 0
    groups: dict[int, list[int]] = field(default_factory=dict)
    field_groups: dict[int, list[int]] = field(default_factory=dict)
    watched: dict[int, set[int]] = field(default_factory=dict)  # group id -> watched field ids
    next_id: int = 1
    reads: int = 0

    def crash(self) -> None:
        self.running = False
        self.generation += 1
        self.groups.clear()
        self.field_groups.clear()
        self.watched.clear()
        self.connections = 0

    def start(self) -> None:
        self.running = True


def make_modules(engine: FakeHostEngine) -> dict[str, ModuleType]:
    structs = ModuleType("dcgm_structs")
    vars(structs).update(ST)
    structs.DCGM_OPERATION_MODE_AUTO = 1
    structs.DCGM_OPERATION_MODE_MANUAL = 2
    structs.DCGM_GROUP_EMPTY = 1

    class DCGMError(Exception):
        """One subclass per status, like the real bindings: DCGMError(code) builds the subclass."""

        classes: ClassVar[dict[int, type]] = {}

        def __new__(cls, value: int = 0):
            target = DCGMError.classes.get(value, DCGMError) if cls is DCGMError else cls
            instance = Exception.__new__(target)
            instance.value = value
            return instance

        def __init__(self, value: int = 0) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            names = {code: name for name, code in ST.items()}
            return f"{names.get(self.value, 'DCGM status')} ({self.value})"

    for name, code in ST.items():
        class_name = "DCGMError_" + "".join(part.capitalize() for part in name[len("DCGM_ST_"):].split("_"))
        DCGMError.classes[code] = type(class_name, (DCGMError,), {})
        setattr(structs, class_name, DCGMError.classes[code])
    structs.DCGMError = DCGMError
    structs.dcgmExceptionClass = DCGMError.classes.get

    fields = ModuleType("dcgm_fields")
    fields.DCGM_FE_GPU = DCGM_FE_GPU
    fields.DCGM_FT_DOUBLE, fields.DCGM_FT_INT64 = "d", "i"

    agent = ModuleType("dcgm_agent")
    agent.dcgmInit = lambda: None
    agent.dcgmShutdown = lambda: None

    def check(generation: int) -> None:
        if not engine.running or generation != engine.generation:
            raise DCGMError(ST["DCGM_ST_CONNECTION_NOT_VALID"])

    class DcgmHandle:
        def __init__(self, handle: Any = None, ipAddress: str | None = None, opMode: int = 1,  # noqa: N803
                     persistAfterDisconnect: bool = False, unixSocketPath: str | None = None,  # noqa: N803
                     timeoutMs: int = 0) -> None:  # noqa: N803
            if not engine.running or ipAddress != engine.address:
                raise DCGMError(ST["DCGM_ST_CONNECTION_NOT_VALID"])
            self.generation = engine.generation
            self.handle = 1
            engine.connections += 1

        def GetSystem(self) -> DcgmSystem:  # noqa: N802
            check(self.generation)
            return DcgmSystem(self)

        def Shutdown(self) -> None:  # noqa: N802
            if self.handle is not None and self.generation == engine.generation:
                engine.connections -= 1
            self.handle = None

    class DcgmSystem:
        def __init__(self, handle: DcgmHandle) -> None:
            self._handle = handle
            self.discovery = SimpleNamespace(
                GetAllSupportedGpuIds=lambda: (check(handle.generation), sorted(engine.gpus))[1],
                GetGpuAttributes=lambda gpu_id: SimpleNamespace(
                    identifiers=SimpleNamespace(uuid=engine.gpus[gpu_id], pciBusId="")),
            )

        def GetGroupWithGpuIds(self, name: str, gpu_ids: list[int]) -> DcgmGroup:  # noqa: N802
            check(self._handle.generation)
            group_id = engine.next_id
            engine.next_id += 1
            engine.groups[group_id] = list(gpu_ids)
            return DcgmGroup(self._handle, group_id)

    class DcgmFieldGroup:
        def __init__(self, dcgmHandle: DcgmHandle, name: str = "", fieldIds: list[int] | None = None) -> None:  # noqa: N803
            check(dcgmHandle.generation)
            self._handle = dcgmHandle
            self.fieldIds = list(fieldIds or [])
            self.fieldGroupId = engine.next_id
            engine.next_id += 1
            engine.field_groups[self.fieldGroupId] = self.fieldIds

        def Delete(self) -> None:  # noqa: N802
            check(self._handle.generation)
            engine.field_groups.pop(self.fieldGroupId, None)

    class Samples:
        def __init__(self, handle: DcgmHandle, group_id: int) -> None:
            self._handle, self._group_id = handle, group_id

        def WatchFields(self, fieldGroup: DcgmFieldGroup, updateFreq: int, maxKeepAge: float,  # noqa: N802, N803
                        maxKeepSamples: int) -> None:  # noqa: N803
            check(self._handle.generation)
            if engine.watch_error is not None:
                raise DCGMError(engine.watch_error)
            engine.watched.setdefault(self._group_id, set()).update(fieldGroup.fieldIds)

        def GetLatest_v2(self, fieldGroup: DcgmFieldGroup) -> Any:  # noqa: N802, N803
            check(self._handle.generation)
            engine.reads += 1
            watched = engine.watched.get(self._group_id, set())
            result: dict[int, dict[int, dict[int, list[Any]]]] = {DCGM_FE_GPU: {}}
            for gpu_id in engine.groups[self._group_id]:
                per_field = result[DCGM_FE_GPU].setdefault(gpu_id, {})
                for field_id in fieldGroup.fieldIds:
                    if field_id not in watched:
                        continue
                    value = engine.values.get(gpu_id, {}).get(field_id)
                    per_field[field_id] = [SimpleNamespace(value=value, isBlank=value is None, ts=0)]
            return SimpleNamespace(values=result)

    class DcgmGroup:
        def __init__(self, handle: DcgmHandle, group_id: int) -> None:
            self._handle, self._groupId = handle, group_id
            self.samples = Samples(handle, group_id)

        def Delete(self) -> None:  # noqa: N802
            check(self._handle.generation)
            engine.groups.pop(self._groupId, None)
            engine.watched.pop(self._groupId, None)

    pydcgm = ModuleType("pydcgm")
    pydcgm.DcgmHandle, pydcgm.DcgmSystem = DcgmHandle, DcgmSystem
    pydcgm.DcgmGroup, pydcgm.DcgmFieldGroup = DcgmGroup, DcgmFieldGroup
    return {"dcgm_structs": structs, "dcgm_fields": fields, "dcgm_agent": agent, "pydcgm": pydcgm}


def install(monkeypatch: Any, engine: FakeHostEngine) -> dict[str, ModuleType]:
    """Make `import pydcgm` (and friends) return the fakes for the duration of one test."""
    modules = make_modules(engine)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return modules


def hide(monkeypatch: Any) -> None:
    """Make the DCGM bindings unimportable, as on a machine without DCGM."""
    for name in ("dcgm_structs", "dcgm_fields", "dcgm_agent", "pydcgm"):
        monkeypatch.setitem(sys.modules, name, None)
