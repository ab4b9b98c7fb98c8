"""report.pdf through the real headless Chromium (Debian package `chromium`)."""

from __future__ import annotations

import pytest

from flopwatch.report import pdf


def test_headless_flags_keep_chromium_off_the_network(tmp_path):
    command = pdf.headless_command("chromium", tmp_path, "--x")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        assert flag in command
    assert f"--user-data-dir={tmp_path}" in command and command[-1] == "--x"


def test_missing_chromium_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pdf.PdfError, match="install the Debian package 'chromium'"):
        pdf.write_pdf(tmp_path / "report.html", tmp_path / "report.pdf")


def test_prints_a_page(tmp_path):
    if pdf.find_chromium() is None:
        pytest.fail("chromium not found: install the Debian package 'chromium' (scripts/setup.sh does)")
    page = tmp_path / "report.html"
    page.write_text("<!DOCTYPE html><html><body><h1>FlopWatch</h1><svg width='200' height='100'>"
                    "<rect width='200' height='100' fill='#1f77b4'/></svg></body></html>")
    out = pdf.write_pdf(page, tmp_path / "report.pdf", timeout=60)
    assert out.read_bytes().startswith(b"%PDF-")
