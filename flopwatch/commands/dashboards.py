"""`flopwatch dashboards build|push`: write the Grafana dashboards as JSON, or upload them."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from flopwatch.commands import actions as sub_actions
from flopwatch.errors import RuntimeFailure, UsageError
from flopwatch.logs import setup_logging

log = logging.getLogger("flopwatch.dashboards")

TOKEN_ENV = "GRAFANA_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from flopwatch.dashboards.common import DOCS_URL
    from flopwatch.dashboards.push import DEFAULT_FOLDER

    actions = sub_actions(parser)
    build = actions.add_parser(
        "build", help="write dashboards/*.json from the code",
        description="Generate the Grafana dashboards (fleet, job, node, network, reliability) as JSON files "
        "named by their stable uid. The committed files are these; a test fails when they drift.")
    build.add_argument("--out", default="dashboards", metavar="DIR", help="where to write (default dashboards/)")
    build.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 if the files in --out differ from the code")
    build.add_argument("--docs-url", default=DOCS_URL, metavar="URL",
                       help=f"base URL of the docs that runbook links point to (default {DOCS_URL})")
    build.add_argument("--log-level", default="info", help="debug, info, warning or error")
    build.set_defaults(handler=run_build)

    push = actions.add_parser(
        "push", help="upload the dashboards to a Grafana",
        description=f"Upload every dashboard to Grafana's HTTP API into a folder, replacing earlier versions "
        f"(same uids), so pushing again is safe. The token comes from --token-file or ${TOKEN_ENV} (a "
        "service-account token with the Editor role); user:password in --url works too.")
    push.add_argument("--url", required=True, metavar="URL", help="Grafana's address, e.g. http://localhost:3000")
    push.add_argument("--token-file", metavar="FILE", help=f"file holding the API token (else ${TOKEN_ENV})")
    push.add_argument("--folder", default=DEFAULT_FOLDER, metavar="NAME",
                      help=f"folder to put the dashboards in, created if missing (default {DEFAULT_FOLDER})")
    push.add_argument("--docs-url", default=DOCS_URL, metavar="URL",
                      help="base URL of the docs that runbook links point to")
    push.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                      help="per-request timeout (default 10)")
    push.add_argument("--log-level", default="info", help="debug, info, warning or error")
    push.set_defaults(handler=run_push)


def run_build(args: argparse.Namespace) -> int:
    from flopwatch import dashboards

    setup_logging(args.log_level)
    if args.check:
        stale = dashboards.stale_files(args.out, args.docs_url)
        if stale:
            raise RuntimeFailure(f"{', '.join(stale)} differ from the code: run `flopwatch dashboards build "
                                 f"--out {args.out}` and commit the result")
        log.info("%d dashboards in %s match the code", len(dashboards.BUILDERS), args.out)
        return 0
    try:
        written = dashboards.write_all(args.out, args.docs_url)
    except OSError as error:
        raise RuntimeFailure(f"cannot write to {args.out}: {error.strerror}") from None
    for path in written:
        log.info("wrote %s", path)
    return 0


def read_token(token_file: str | None, environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The API token from --token-file, else $GRAFANA_TOKEN, else None (URL credentials or anonymous)."""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise UsageError(f"--token-file {token_file}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--token-file {token_file}: not a text file holding a token") from None
        if not token:
            raise UsageError(f"--token-file {token_file}: the file is empty; put the Grafana API token in it")
        return token
    return environ.get(TOKEN_ENV, "").strip() or None


def run_push(args: argparse.Namespace) -> int:
    from flopwatch import dashboards
    from flopwatch.dashboards import push

    setup_logging(args.log_level)
    if args.timeout <= 0:
        raise UsageError("--timeout: must be more than 0 seconds")
    token = read_token(args.token_file)
    try:
        if token is None and push.check_url(args.url)[4] is None:
            log.warning("no token (--token-file or $%s): pushing without credentials", TOKEN_ENV)
        pushed = push.push(args.url, token, dashboards.build_all(args.docs_url), folder=args.folder,
                           timeout=args.timeout)
    except push.BadTarget as error:
        raise UsageError(str(error)) from None
    except push.PushError as error:
        raise RuntimeFailure(str(error)) from None
    log.info("pushed %d dashboards to %s, folder %s", len(pushed), push.display_url(args.url), args.folder)
    return 0
