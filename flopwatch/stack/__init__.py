"""Real servers from Debian's packages, started on free loopback ports in temporary directories.

The demo and every integration test start servers only through this package, so readiness
checks, logs and cleanup live in one place: each server runs in its own process group, is stopped
on context exit, on Ctrl-C, on a hang-up (SIGHUP unwinds like Ctrl-C unless the program handles or
ignores it) and at interpreter exit, and a program that dies without cleaning up (SIGKILL) has its
servers stopped by its watchdog process (watchdog.py): no process is left behind.
"""

from flopwatch.stack.agent import AgentProcess
from flopwatch.stack.process import MissingBinary, ServerError, ServerProcess, free_port, stop_all
from flopwatch.stack.servers import Alertmanager, NodeExporter, Prometheus, VictoriaMetrics, VmAlert

__all__ = [
    "AgentProcess",
    "Alertmanager",
    "MissingBinary",
    "NodeExporter",
    "Prometheus",
    "ServerError",
    "ServerProcess",
    "VictoriaMetrics",
    "VmAlert",
    "free_port",
    "stop_all",
]
