"""flopwatch.resources: the checkout's folders in a source tree, the wheel's copies when installed,
and a missing one is an error naming it (the demo and bench detect stop before starting anything)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwatch import cli, resources

ROOT = Path(__file__).resolve().parents[1]


def test_a_source_checkout_reads_the_repository_folders():
    assert resources.source_root() == ROOT
    assert resources.folder("alerts") == ROOT / "alerts"
    assert resources.folder("scenarios") == ROOT / "flopwatch" / "detect" / "scenarios"
    assert resources.file("alerts", "alertmanager.yml") == ROOT / "alerts" / "alertmanager.yml"
    assert resources.rule_files() and all(p.parent == ROOT / "alerts" for p in resources.rule_files())
    assert "alertmanager.yml" not in {p.name for p in resources.rule_files()}


@pytest.fixture
def installed_without_data(monkeypatch, tmp_path):
    """An install whose package has no _data folder."""
    monkeypatch.setattr(resources, "source_root", lambda: None)
    monkeypatch.setattr(resources.resources, "files", lambda package: tmp_path)


def test_a_missing_folder_is_an_error_naming_it(installed_without_data):
    with pytest.raises(resources.MissingResource, match=r"^alerts/ not found at .*_data/alerts"):
        resources.folder("alerts")


@pytest.mark.parametrize("command", [["demo", "--duration", "5"], ["bench", "detect", "--quick"]])
def test_commands_stop_with_one_line_when_data_is_missing(installed_without_data, command, capsys):
    assert cli.main(command) == cli.EXIT_FAILURE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not found" in err[0], err
    assert "alerts/" in err[0] or "flopwatch/detect/scenarios/" in err[0], err
