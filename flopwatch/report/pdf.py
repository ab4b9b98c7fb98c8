"""report.pdf through headless Chromium (Debian package `chromium`) when it is installed.

Chromium runs with a fresh empty profile and everything that would reach the network switched
off: without those flags a machine with no network makes it hang on connection attempts.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome")
PACKAGE = "chromium"
HEADLESS_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
)


class PdfError(RuntimeError):
    """Chromium could not print the report; the message says why."""


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, BINARIES) if path), None)


def headless_command(binary: str, profile: Path, *extra: str) -> list[str]:
    """Chromium's command line with the offline-safe flags and a throwaway profile directory."""
    return [binary, *HEADLESS_FLAGS, f"--user-data-dir={profile}", *extra]


def write_pdf(html_path: Path, pdf_path: Path, timeout: float = 90.0) -> Path:
    """Print html_path to pdf_path (A4-ish, no header/footer); raises PdfError on failure."""
    binary = find_chromium()
    if binary is None:
        raise PdfError(f"chromium not found: install the Debian package '{PACKAGE}' for report.pdf")
    with tempfile.TemporaryDirectory(prefix="flopwatch-chromium-") as profile:
        command = headless_command(binary, Path(profile), "--no-pdf-header-footer",
                                   f"--print-to-pdf={pdf_path.resolve()}", html_path.resolve().as_uri())
        try:
            done = subprocess.run(command, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise PdfError(f"chromium did not finish printing within {timeout:g}s") from None
        except OSError as error:
            raise PdfError(f"cannot run {binary}: {error.strerror}") from None
    if done.returncode != 0 or not pdf_path.exists() or pdf_path.stat().st_size == 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise PdfError(f"chromium exited with {done.returncode} without a PDF ({tail[0][:200]})")
    return pdf_path
