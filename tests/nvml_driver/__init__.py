"""A driver-shaped `libnvidia-ml.so.1` for tests, built with gcc against NVIDIA's own `nvml.h`.

`build()` compiles nvml_driver.c once per source/header pair (cached in the temp directory), so
the real nvidia-ml-py can load it: a subprocess finds it through LD_LIBRARY_PATH (`environment()`),
this process through `InProcess`, which loads it by path before a fresh copy of the real pynvml
module asks the dynamic loader for `libnvidia-ml.so.1` (the loader matches the soname).

`DriverState` writes the state file the library re-reads when it changes: the GPUs (H100, H200,
A100, B200) and the faults (a lost GPU, an XID delivered through the event set, an error code
per function, a hanging call, a driver restart, a failing nvmlInit).
"""

from __future__ import annotations

import _ctypes
import ctypes
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

SOURCE = Path(__file__).with_name("nvml_driver.c")
LIBRARY = "libnvidia-ml.so.1"
STATE_VARIABLE = "FLOPWATCH_NVML_STATE"
FRESH_MODULE = "pynvml_on_test_driver"
MODELS = ("H100", "H200", "A100", "B200")
#: NVML's device names for the models above (what nvmlDeviceGetName answers)
DEVICE_NAMES = {"A100": "NVIDIA A100-SXM4-80GB", "H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200",
                "B200": "NVIDIA B200"}


class BuildError(RuntimeError):
    """gcc or NVIDIA's header is missing, or the library did not compile."""


def header_dir() -> Path:
    """The include directory of the PyPI package nvidia-nvml-dev (nvidia/cu*/include/nvml.h)."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob("cu*/include/nvml.h"), reverse=True):
            return candidate.parent
    raise BuildError("NVIDIA's nvml.h not found: pip install nvidia-nvml-dev (the `test` extra)")


@functools.cache
def build() -> Path:
    """The directory holding the compiled libnvidia-ml.so.1 (compiled once per source and header)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("gcc not found: install the Debian package gcc")
    include = header_dir()
    digest = hashlib.sha256(SOURCE.read_bytes() + (include / "nvml.h").read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"flopwatch-nvml-driver-{os.getuid()}-{digest}"
    if (out / LIBRARY).exists():
        return out
    staging = Path(tempfile.mkdtemp(prefix="flopwatch-nvml-build-"))
    command = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Wno-deprecated-declarations",
               # a definition whose types differ from nvml.h's prototype is an error in any case
               "-Werror=incompatible-pointer-types", "-Werror=implicit-function-declaration", "-Werror=int-conversion",
               f"-I{include}", f"-Wl,-soname,{LIBRARY}", "-o", str(staging / LIBRARY), str(SOURCE), "-lpthread"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise BuildError(f"gcc failed on {SOURCE.name}:\n{result.stderr}")
    try:
        staging.rename(out)
    except OSError:  # another process built it first
        shutil.rmtree(staging, ignore_errors=True)
    return out


def environment(state_path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which a subprocess's nvidia-ml-py loads the library with this state."""
    environ = dict(os.environ if base is None else base)
    library_dir = str(build())
    environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [library_dir, environ.get("LD_LIBRARY_PATH")]))
    environ[STATE_VARIABLE] = str(state_path)
    return environ


@dataclass
class Gpu:
    """One GPU of the state file: its model and per-GPU settings and faults."""

    model: str = "H100"
    values: dict[str, Any] = field(default_factory=dict)   # `KEY VALUE` lines, NVML units
    fails: dict[str, int] = field(default_factory=dict)    # NVML function -> error code it returns
    hangs: dict[str, float] = field(default_factory=dict)  # NVML function -> seconds it blocks
    field_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    violations: dict[int, int] = field(default_factory=dict)  # perf policy -> ns (-1: not supported)


class DriverState:
    """The library's state file. Each change is a new file behind an atomically swapped symlink,
    so the library's stat() always sees a new inode (old files stay until the directory goes)."""

    def __init__(self, directory: Path, models: list[str] | tuple[str, ...] = ("H100",)) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "state"
        self.gpus = [Gpu(model) for model in models]
        self.driver, self.nvml, self.epoch, self.init_error = "550.54.15", "12.550.54.15", 0, 0
        self.clock: float | None = None     # the counters' clock in seconds; None: the library's monotonic one
        self.xids: list[tuple[int, int]] = []
        self._serial = 0
        self._lock = threading.Lock()
        self.write()

    def text(self) -> str:
        lines = [f"driver {self.driver}", f"nvml {self.nvml}", f"epoch {self.epoch}", f"init_error {self.init_error}"]
        lines += [f"clock {self.clock!r}"] if self.clock is not None else []
        lines += [f"gpus 1 {gpu.model}" for gpu in self.gpus]
        for index, gpu in enumerate(self.gpus):
            lines.append(f"gpu {index}")
            lines += [f"{key} {value}" for key, value in gpu.values.items()]
            lines += [f"fail {function} {code}" for function, code in gpu.fails.items()]
            lines += [f"hang {function} {seconds}" for function, seconds in gpu.hangs.items()]
            lines += [f"field_error {f} {s} {code}" for (f, s), code in gpu.field_errors.items()]
            lines += [f"violation {policy} {ns}" for policy, ns in gpu.violations.items()]
        lines += [f"xid {gpu} {code}" for gpu, code in self.xids]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        with self._lock:
            self._serial += 1
            target = self.directory / f"state.{self._serial}"
            target.write_text(self.text())
            link = self.directory / f".state.{self._serial}.link"
            link.symlink_to(target.name)
            os.replace(link, self.path)

    # -- faults --------------------------------------------------------------------------------
    def set(self, index: int, **values: Any) -> None:
        self.gpus[index].values.update(values)
        self.write()

    def lose(self, index: int, xid: int | None = 79) -> None:
        """The GPU fell off the bus: GPU_IS_LOST on every call, and (by default) XID 79 delivered."""
        if xid is not None:
            self.xids.append((index, xid))
        self.set(index, lost=1)

    def restore(self, index: int) -> None:
        """Back after a reset, under a new handle: the old handle keeps answering GPU_IS_LOST."""
        values = self.gpus[index].values
        self.set(index, lost=0, reset=int(values.get("reset", 0)) + 1)

    def inject_xid(self, index: int, xid: int) -> None:
        self.xids.append((index, xid))
        self.write()

    def fail(self, index: int, function: str, code: int) -> None:
        self.gpus[index].fails[function] = code
        self.write()

    def hang(self, index: int, function: str, seconds: float) -> None:
        self.gpus[index].hangs[function] = seconds
        self.write()

    def release(self) -> None:
        """End every injected hang (a hung call returns within 10 ms of this)."""
        for gpu in self.gpus:
            gpu.hangs.clear()
        self.write()

    def set_clock(self, seconds: float) -> None:
        """The counters (energy, GPM, PCIe and NVLink bytes) integrate their rates up to `seconds`."""
        self.clock = seconds
        self.write()

    def restart_driver(self) -> None:
        """The driver was reloaded: every call UNINITIALIZED until NVML is shut down and initialised."""
        self.epoch += 1
        self.write()


class InProcess:
    """The library loaded into this process, under a fresh instance of the real pynvml module.

    The fresh instance keeps the `pynvml` in sys.modules untouched (it still finds no driver);
    `close()` unloads the library again so later tests see this machine as it is.
    """

    def __init__(self) -> None:
        self.path = build() / LIBRARY
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.flopwatch_nvml_calls.restype = ctypes.c_ulonglong
        self.lib.flopwatch_nvml_calls.argtypes = [ctypes.c_char_p]
        self.lib.flopwatch_nvml_live.argtypes = [ctypes.c_char_p]
        spec = importlib.util.find_spec("pynvml")
        assert spec is not None and spec.origin is not None, "nvidia-ml-py is not installed"
        fresh = importlib.util.spec_from_file_location(FRESH_MODULE, spec.origin)
        assert fresh is not None and fresh.loader is not None
        self.pynvml: ModuleType = importlib.util.module_from_spec(fresh)
        sys.modules[FRESH_MODULE] = self.pynvml  # pynvml looks itself up there while it loads
        fresh.loader.exec_module(self.pynvml)

    def calls(self, function: str) -> int:
        """How often the library's entry point `function` ("*": all of them) was called since it was loaded."""
        return int(self.lib.flopwatch_nvml_calls(function.encode()))

    def live(self, kind: str) -> int:
        """Allocated and not freed: kind is 'samples' (GPM) or 'event_sets'."""
        return int(self.lib.flopwatch_nvml_live(kind.encode()))

    def loaded(self) -> bool:
        return str(self.path) in Path("/proc/self/maps").read_text()

    def close(self) -> None:
        """Drop both references the loader holds (ours and pynvml's) so the library unmaps."""
        handles = [self.lib._handle]
        own = getattr(self.pynvml, "nvmlLib", None)
        if own is not None:
            handles.append(own._handle)
        for handle in handles:
            _ctypes.dlclose(handle)
        sys.modules.pop(FRESH_MODULE, None)

