"""Command line: ``python -m router --config FILE`` (or ``--models-dir DIR``) runs the router; subcommands
do the rest.

Each command imports what it uses, inside its function: ``plan``, ``init``, ``import-config``,
``make-model`` and ``--version`` load no HTTP stack (hypercorn, quart, httpx, trio, prometheus_client), so
they start fast and stay small (tests/unit/test_command_imports.py holds them to it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from router.config.load import ConfigError
from router.config.source import ConfigSource

NO_CONFIG = "no configuration: pass --config FILE, --models-dir DIR, or set ROUTER_CONFIG_PATH"


def _source(args: argparse.Namespace) -> ConfigSource | None:
    file = args.config or os.environ.get("ROUTER_CONFIG_PATH") or None
    if file is None and args.models_dir is None:
        return None
    return ConfigSource(
        file=Path(file) if file else None,
        models_dir=Path(args.models_dir) if args.models_dir else None,
        host=args.host,
        port=args.port,
    )


def version_lines(args: argparse.Namespace) -> list[str]:
    """``--version``: the router's version (package metadata) and the build of the llama-server it would run
    (the configured one with --config or --models-dir, else the one found on PATH or installed)."""
    from router.hosts.locate import (
        MINIMUM_LLAMA_CPP_BUILD,
        LlamaServerNotFound,
        cached_llama_server,
        find_llama_server,
    )
    from router.hosts.server_build import read_build
    from router.version import package_version

    lines = [f"llama-router {package_version()}"]
    configured = None
    source = _source(args)
    if source is not None:
        try:
            configured = source.load().router.llama_server
        except (ConfigError, OSError) as exc:
            return [*lines, f"llama-server: not looked up ({exc})"]
    try:
        binary = find_llama_server(configured)
    except LlamaServerNotFound:
        if configured:
            return [*lines, f"llama-server: {configured!r} is missing or not an executable file"]
        return [*lines, f"llama-server: none found on PATH or at {cached_llama_server()}"]
    build = read_build(binary)
    text = build.describe()
    if build.number is not None and build.number < MINIMUM_LLAMA_CPP_BUILD:
        text += f"; llama-router needs build b{MINIMUM_LLAMA_CPP_BUILD} or newer"
    return [*lines, f"llama-server {binary} ({text})"]


def fail(message: str) -> int:
    """A command that cannot do its work: the message on stderr, exit status 2."""
    print(message, file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    from router.hosts.locate import LlamaServerNotFound
    from router.serve.listen import ListenError
    from router.serve.server import main_run

    source = _source(args)
    if source is None:
        return fail(NO_CONFIG)
    try:
        return main_run(source.load(), source)
    except (LlamaServerNotFound, ConfigError, ListenError) as exc:
        return fail(str(exc))


def _plan(args: argparse.Namespace) -> int:
    from router.deploy.bridge import plan_command

    source = _source(args)
    if source is None:
        return fail(NO_CONFIG)
    return plan_command(source, as_json=args.json)


def _init(args: argparse.Namespace) -> int:
    from router.cli.init_config import init_command

    if args.models_dir is None:
        return fail("init needs --models-dir DIR: the folder whose GGUF files the configuration serves")
    return init_command(ConfigSource(models_dir=Path(args.models_dir)))


def _import(args: argparse.Namespace) -> int:
    from router.cli.import_config import import_command

    presets = Path(args.presets_ini) if args.presets_ini else None
    return import_command(Path(args.config_json), presets)


def _add_common(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--config", default=default(None), help="TOML or JSON config (default: $ROUTER_CONFIG_PATH)"
    )
    parser.add_argument(
        "--models-dir",
        default=default(None),
        help="serve every GGUF model in this folder (with --config: added to the file's models)",
    )
    parser.add_argument(
        "--host", default=default(None), help="listen address (overrides config and ROUTER_HOST)"
    )
    parser.add_argument(
        "--port", type=int, default=default(None), help="listen port (overrides config and ROUTER_PORT)"
    )
    parser.add_argument("--log-level", default=default(os.environ.get("ROUTER_LOG_LEVEL", "INFO")))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "make-model":
        from router.cli.tinymodel import main as make_model

        return make_model(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m router", description="llama-router")
    _add_common(parser, defaults=True)
    # The subcommands take the same options; their defaults are suppressed so that an option given before
    # the subcommand (``--models-dir DIR plan``) is not reset by it.
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, defaults=False)
    parser.add_argument(
        "--version",
        action="store_true",
        help="print the version of llama-router and the build of its llama-server, and exit",
    )
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="run the router (the default)", parents=[common])
    plan = sub.add_parser("plan", help="print the memory plan of every model and exit", parents=[common])
    plan.add_argument("--json", action="store_true", help="print the versioned JSON document")
    sub.add_parser(
        "init", help="print a commented config for the models of --models-dir DIR", parents=[common]
    )
    imported = sub.add_parser(
        "import-config",
        help="print the TOML equivalent of an original llama-router config.json and presets.ini",
    )
    imported.add_argument("config_json", metavar="CONFIG_JSON", help="the original config.json")
    imported.add_argument(
        "presets_ini",
        metavar="PRESETS_INI",
        nargs="?",
        help="its presets.ini (default: $LLAMA_PRESETS_PATH, else presets.ini beside CONFIG_JSON)",
    )
    sub.add_parser("make-model", help="write a tiny random-weight GGUF model (see make-model --help)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # httpx logs every request the router forwards at INFO; INFO is for the router's own decisions.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.version:
        print("\n".join(version_lines(args)))
        parser.exit(0)
    if args.command == "plan":
        return _plan(args)
    if args.command == "init":
        return _init(args)
    if args.command == "import-config":
        return _import(args)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
