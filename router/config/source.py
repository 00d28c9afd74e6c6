"""Where the configuration comes from: a config file, a folder of models, or both; and --host / --port.

``ConfigSource.load()`` builds the Config (at startup, and again for every reload, so a reload rescans the
folder too):

* a file alone: ``router.config.load.load_config`` (our TOML or JSON, or an original llama-router
  config.json with its presets.ini, see ``router.config.original``);
* a folder alone (``--models-dir DIR``): every model ``router.config.model_folder`` finds becomes a
  ``[models.NAME]`` table with ``model``, ``gpus = "all"`` (every GPU the router detects, GPU 0 where it
  detects none) and the paired ``mmproj``; everything else keeps its default, and the ROUTER_* environment
  variables apply as with a file. Relative paths start at the folder.
* both: the folder's models are added to the file's. The file wins: a folder model whose name the file
  already uses (as a model, pool or alias) is left out with a warning, and one whose file a model of the
  config file already serves is left out silently.

``--host`` and ``--port`` override the file and the environment.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from router.config.keyspec import InvalidValue, check_value, render_value, spec_by_name
from router.config.load import (
    Config,
    ConfigError,
    config_from_dict,
    load_config,
    read_config_document,
    validated,
)
from router.config.model_folder import FolderError, FolderModel, FolderScan, scan_folder
from router.config.schema import ROUTER_KEYS

__all__ = ["ConfigSource", "folder_table"]

log = logging.getLogger("router")


def folder_table(model: FolderModel) -> dict[str, Any]:
    """The ``[models.NAME]`` table of a model found in a folder."""
    table: dict[str, Any] = {"model": str(model.path), "gpus": "all"}
    if model.mmproj is not None:
        table["mmproj"] = str(model.mmproj)
    return table


@attrs.frozen
class ConfigSource:
    """A config file and/or a models folder, and the listen address given on the command line."""

    file: Path | None = None
    models_dir: Path | None = None
    host: str | None = None
    port: int | None = None

    def describe(self) -> str:
        parts = [str(p) for p in (self.file, self.models_dir) if p is not None]
        return " + ".join(parts) or "nothing"

    def load(self, env: Mapping[str, str] | None = None) -> Config:
        """Build the configuration; ConfigError for every problem (a bad file, an empty folder, ...)."""
        env = os.environ if env is None else env
        if self.models_dir is not None:
            config = self._with_folder(env)
        elif self.file is not None:
            config = load_config(self.file, env)
        else:
            raise ConfigError("<none>", "no configuration: pass --config FILE or --models-dir DIR")
        return self._with_listen_address(config)

    def scan(self) -> FolderScan:
        """The models folder, scanned; its warnings are logged."""
        assert self.models_dir is not None
        try:
            scan = scan_folder(self.models_dir)
        except FolderError as exc:
            raise ConfigError(self.models_dir, f"--models-dir: {exc}") from None
        for warning in scan.warnings:
            log.warning("models folder: %s", warning)
        return scan

    def _with_folder(self, env: Mapping[str, str]) -> Config:
        scan = self.scan()
        if self.file is None:
            if not scan.models:
                raise ConfigError(scan.folder, "no GGUF model found in this folder or its sub-folders")
            doc = {"models": {m.name: folder_table(m) for m in scan.models}}
            return config_from_dict(doc, scan.folder, env=env, base_dir=scan.folder)
        data, translation = read_config_document(self.file, env)
        return validated(
            _merged(data, self.file, scan),
            self.file,
            env=env,
            base_dir=self.file.absolute().parent,
            translation=translation,
        )

    def _with_listen_address(self, config: Config) -> Config:
        changes: dict[str, Any] = {}
        for name, value in (("host", self.host), ("port", self.port)):
            if value is None:
                continue
            try:
                changes[name] = check_value(spec_by_name(ROUTER_KEYS, name), value)
            except InvalidValue as exc:
                raise ConfigError(
                    config.path, f"--{name} {render_value(value)} is invalid: {exc.reason}", key=f"--{name}"
                ) from None
        if not changes:
            return config
        return attrs.evolve(config, router=attrs.evolve(config.router, **changes))


def _strings(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def _merged(data: Any, file: Path, scan: FolderScan) -> Any:
    """The file's document with the folder's models added (see the module docstring). A document too
    broken to merge into is returned as it is: validating it names the problem."""
    if not isinstance(data, Mapping):
        return data
    models = data.get("models") or {}
    pools = data.get("pools") or {}
    if not isinstance(models, Mapping) or not isinstance(pools, Mapping):
        return data
    taken: dict[str, str] = {}
    served: dict[Path, str] = {}
    base = file.absolute().parent
    for kind, tables in (("models", models), ("pools", pools)):
        for name, table in tables.items():
            taken[str(name)] = f"{kind}.{name}"
            if not isinstance(table, Mapping):
                continue
            for alias in _strings(table.get("aliases")):
                taken[alias] = f"an alias of {kind}.{name}"
            path = table.get("model") if kind == "models" else None
            if isinstance(path, str) and path.strip():
                served[(base / Path(path).expanduser()).resolve()] = str(name)
    merged = dict(models)
    for model in scan.models:
        if model.name in taken:
            log.warning(
                "models folder: %s is not served as %r: %s in %s has that name, and the file wins",
                model.path,
                model.name,
                taken[model.name],
                file,
            )
            continue
        if model.path.resolve() in served:
            log.info("models folder: %s is already served as %s", model.path, served[model.path.resolve()])
            continue
        merged[model.name] = folder_table(model)
    return {**data, "models": merged}
