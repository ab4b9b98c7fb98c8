"""Generated reference docs stay in step with the code that defines them."""

from __future__ import annotations

from pathlib import Path

from flopwatch import config as cfg
from flopwatch.commands.docs import replace_settings_table

ROOT = Path(__file__).resolve().parents[1]


def test_agent_settings_table_matches_config_fields():
    committed = (ROOT / "docs" / "agent.md").read_text()
    assert committed == replace_settings_table(committed), (
        "docs/agent.md's settings table drifted from flopwatch/config.py: run "
        "`flopwatch docs agent` and commit the result"
    )
    for key in cfg.FIELDS:
        assert f"| `{key}` | `{cfg.env_name(key)}` |" in committed
