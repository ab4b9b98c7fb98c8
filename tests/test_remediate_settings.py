"""`flopwatch remediate`'s settings (flopwatch/remediate/settings.py): the remediation: section of
the one settings file, environment and flags over it, one-line errors with exit 2; the mixin's
loader leaves the section to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwatch.cli import main
from flopwatch.config import ConfigError
from flopwatch.mixin import config as mixin
from flopwatch.remediate.settings import DEFAULT_ACTIONS, load


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flopwatch.yml"
    path.write_text(text)
    return path


def test_defaults_are_a_dry_run_with_the_shipped_policy() -> None:
    settings = load(None, {})
    assert settings["dry_run"] is True and dict(settings.actions) == DEFAULT_ACTIONS
    assert settings.action("FlopWatchGpuThrottled") == "none"


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "dtype: fp8\nremediation:\n  dry_run: false\n  breaker: {max_nodes: 3, window: 30m}\n"
                           "  actions: {FlopWatchNvlinkErrors: drain, FlopWatchGpuLost: none}\n")
    settings = load(path, {"FLOPWATCH_REMEDIATE_BREAKER_MAX_NODES": "5"}, {"listen": "127.0.0.1:0"})
    assert (settings["dry_run"], settings["breaker.max_nodes"], settings["breaker.window"]) == (False, 5, 1800.0)
    assert settings.action("FlopWatchNvlinkErrors") == "drain" and settings.action("FlopWatchGpuLost") == "none"
    assert settings["listen"] == "127.0.0.1:0"
    assert mixin.load(path).dtype == "fp8"      # the rules' loader reads the same file, leaving remediation alone


@pytest.mark.parametrize(("section", "message"), [
    ("actions: {FlopWatchNoSuchAlert: drain}", ":3: remediation.actions: unknown alert 'FlopWatchNoSuchAlert'"),
    ("actions: {FlopWatchGpuLost: reboot}", ":3: remediation.actions.FlopWatchGpuLost: unknown action 'reboot'"),
    ("actions: {FlopWatchAgentDown: drain}", ":3: remediation.actions.FlopWatchAgentDown: its only evidence is"),
    ("breaker: {max_nodes: 0}", ":3: remediation.breaker.max_nodes: expected nodes drained per window"),
    ("breaker: {maximum: 3}", ":3: unknown setting 'remediation.breaker.maximum'"),
    ("return: {hold_down: soon}", ":3: remediation.return.hold_down: expected a duration"),
])
def test_a_wrong_policy_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               section: str, message: str) -> None:
    path = write(tmp_path, f"dtype: bf16\nremediation:\n  {section}\n")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load(path, {})
    assert main(["remediate", "plan", "--config", str(path), "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"flopwatch remediate: {path}{message}")
    assert not (tmp_path / "state").exists()


def test_a_wrong_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"environment FLOPWATCH_REMEDIATE_DRY_RUN: remediation\.dry_run"):
        load(None, {"FLOPWATCH_REMEDIATE_DRY_RUN": "maybe"})


def test_every_setting_has_a_row_in_the_docs() -> None:
    from flopwatch.remediate.settings import FIELDS

    text = (Path(__file__).resolve().parent.parent / "docs" / "remediation.md").read_text()
    missing = [key for key in FIELDS if f"| `{key}` |" not in text]
    assert missing == [], f"docs/remediation.md: no row for {missing}"
