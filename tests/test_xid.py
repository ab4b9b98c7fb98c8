"""flopwatch/xid.py: the XID table that decides page versus ticket (NVIDIA's Xid catalogue)."""

from __future__ import annotations

import re

from flopwatch import xid


def test_codes_that_stop_the_gpu_or_the_job_page() -> None:
    assert xid.codes("page") == [48, 62, 64, 74, 79, 94, 95, 119, 120]
    assert xid.page_regex() == "48|62|64|74|79|94|95|119|120"


def test_reset_or_drain_when_convenient_and_application_codes_are_tickets() -> None:
    for code in (13, 31, 43, 63, 92):
        assert xid.lookup(code).severity == "ticket"


def test_unknown_codes_are_tickets_pointing_at_the_catalogue() -> None:
    entry = xid.lookup(999)
    assert entry.severity == "ticket"
    assert xid.CATALOGUE_URL in entry.action


def test_every_entry_says_what_it_means_and_what_to_do() -> None:
    for code, entry in xid.TABLE.items():
        assert entry.code == code
        assert entry.meaning and entry.action
        assert entry.severity in ("page", "ticket")


def test_action_template_has_one_branch_per_code_of_the_severity() -> None:
    for severity in ("page", "ticket"):
        text = xid.action_template(severity)
        assert [int(c) for c in re.findall(r'eq \$labels\.xid "(\d+)"', text)] == xid.codes(severity)
        assert text.count("{{ if ") == 1 and text.endswith("{{ end }}")
        assert "{{ else }}unlisted XID" in text
