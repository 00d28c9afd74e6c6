"""Command line: ``python -m router --config FILE`` runs the router; subcommands do the rest."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from .config import ConfigError, load_config
from .locate import LlamaServerNotFound


def package_version() -> str:
    """The installed package's version; from pyproject.toml when running from a source tree without one."""
    try:
        return metadata.version("llama-router")
    except metadata.PackageNotFoundError:
        pass
    try:
        with (Path(__file__).resolve().parent.parent / "pyproject.toml").open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``: print the package version and exit 0 (looked up only when asked)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"llama-router {package_version()}")
        parser.exit(0)


def _run(args: argparse.Namespace) -> int:
    from .server import fail, main_run

    path = args.config or os.environ.get("ROUTER_CONFIG_PATH")
    if not path:
        return fail("no configuration: pass --config FILE or set ROUTER_CONFIG_PATH")
    try:
        config = load_config(path)
    except ConfigError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"cannot read config {path}: {exc.strerror or exc}")
    try:
        return main_run(config)
    except (LlamaServerNotFound, ConfigError) as exc:
        return fail(str(exc))


def _plan(args: argparse.Namespace) -> int:
    from .placement_bridge import plan_command

    return plan_command(args.config or os.environ.get("ROUTER_CONFIG_PATH"), as_json=args.json)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "make-model":
        from .tinymodel import main as make_model

        return make_model(argv[1:])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML or JSON config (default: $ROUTER_CONFIG_PATH)")
    common.add_argument("--log-level", default=os.environ.get("ROUTER_LOG_LEVEL", "INFO"))
    parser = argparse.ArgumentParser(prog="python -m router", description="llama-router", parents=[common])
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="run the router (the default)", parents=[common])
    plan = sub.add_parser("plan", help="print the memory plan of every model and exit", parents=[common])
    plan.add_argument("--json", action="store_true", help="print the versioned JSON document")
    sub.add_parser("make-model", help="write a tiny random-weight GGUF model (see make-model --help)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "plan":
        return _plan(args)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
