"""The XID table: what each NVIDIA driver error code means and who must act, in one place.

Source: NVIDIA's Xid catalogue, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), whose "Resolution Bucket
(Immediate Action)" column says what each code asks for (RESTART_APP, RESET_GPU, RESTART_BM,
CONTACT_SUPPORT, IGNORE, ...). FlopWatch turns that into two severities:

- ``page``: the GPU or the job has stopped (double-bit ECC, micro-controller halt, failed row
  remap, NVLink error, fallen off the bus, contained/uncontained ECC, GSP timeout/error);
  a person must drain or reset now because the training job is down or about to be.
- ``ticket``: everything else — codes that ask for a reset or a drain when convenient (63 row
  remap pending, 92 high single-bit ECC rate) and application-level codes (13, 31, 43, ...).

alerts/flopwatch-gpu.yml selects the page codes with a regex; tests/test_rules.py checks that the
regex, and the action text the alert shows, are exactly the ones built here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["page", "ticket"]
CATALOGUE_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


@dataclass(frozen=True)
class Xid:
    code: int
    meaning: str       # the catalogue's description, shortened
    action: str        # what to do, from the catalogue's resolution bucket
    severity: Severity


TABLE: dict[int, Xid] = {x.code: x for x in (
    Xid(13, "graphics engine exception", "restart the application; if it repeats on this GPU only, run "
        "field diagnostics", "ticket"),
    Xid(31, "GPU memory page fault", "restart the application (usually an application bug)", "ticket"),
    Xid(43, "GPU stopped processing (channel reset)", "restart the application", "ticket"),
    Xid(45, "preemptive cleanup after an earlier error", "none: look at the XID before it", "ticket"),
    Xid(48, "double-bit ECC error", "drain the node and reset the GPU", "page"),
    Xid(61, "internal micro-controller breakpoint/warning", "reset the GPU when convenient", "ticket"),
    Xid(62, "internal micro-controller halt", "drain the node and reset the GPU", "page"),
    Xid(63, "row remap / page retirement recorded", "reset the GPU when convenient to apply the remap",
        "ticket"),
    Xid(64, "row remap / page retirement failed", "drain the node, reset the GPU; RMA if it repeats", "page"),
    Xid(68, "video decoder exception", "restart the application", "ticket"),
    Xid(74, "NVLink error", "drain the node and reset the GPUs on the link; check the NVLink/NVSwitch",
        "page"),
    Xid(79, "GPU has fallen off the bus", "drain the node and reboot it; RMA if it repeats", "page"),
    Xid(92, "high single-bit ECC error rate", "drain when convenient and reset the GPU", "ticket"),
    Xid(94, "contained ECC error", "restart the application; reset the GPU when convenient", "page"),
    Xid(95, "uncontained ECC error", "drain the node and reset the GPU", "page"),
    Xid(119, "GSP RPC timeout", "drain the node and reset the GPU (or reboot)", "page"),
    Xid(120, "GSP error", "drain the node and reset the GPU (or reboot)", "page"),
    Xid(121, "C2C link corrected error", "none unless it repeats; then reset when convenient", "ticket"),
    Xid(154, "GPU recovery action changed", "follow the recovery action nvidia-smi reports", "ticket"),
)}

UNKNOWN_ACTION = f"look the code up in NVIDIA's Xid catalogue ({CATALOGUE_URL})"


def lookup(code: int) -> Xid:
    """The entry for `code`; an unknown code is a ticket pointing at the catalogue."""
    return TABLE.get(code) or Xid(code, "unlisted XID", UNKNOWN_ACTION, "ticket")


def codes(severity: Severity) -> list[int]:
    return sorted(code for code, entry in TABLE.items() if entry.severity == severity)


def page_regex() -> str:
    """The `xid` label regex of FlopWatchGpuXidCritical: every page code, ascending."""
    return "|".join(str(code) for code in codes("page"))


def action_template(severity: Severity) -> str:
    """A Go-template chain that prints meaning and action for `$labels.xid` in an alert.

    Prometheus templates cannot read a Python table, so the alert of each severity carries the
    branches for its codes, generated here and compared by a test, never a hand-kept copy.
    """
    branches = [f'{{{{ {"if" if i == 0 else "else if"} eq $labels.xid "{code}" }}}}'
                f"{TABLE[code].meaning}: {TABLE[code].action}" for i, code in enumerate(codes(severity))]
    return "".join(branches) + f"{{{{ else }}}}unlisted XID: {UNKNOWN_ACTION}{{{{ end }}}}"
