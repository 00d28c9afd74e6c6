"""Ollama's descriptive calls on the quart app (``router.http.ollama.documents``) in Ollama's shapes,
and a clear refusal for its model-management calls: models here are files named in the router's config."""

from __future__ import annotations

import json

from quart import Response
from quart_trio import QuartTrio

from router.http.admission import current_client
from router.http.errors import unknown_model_message
from router.http.ollama.documents import names, ps_entries, show_document, tag_entry, version_document
from router.http.ollama.requests import PATHS
from router.http.request_body import BodyError, parse_object, read_body
from router.http.scope import scope_refusal, usable
from router.shell.views import RouterView

# Ollama's calls that manage model files: refused, saying where models come from here.
MANAGEMENT = ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete", "/api/blobs")


def _json(doc: object, status: int = 200) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


def register_ollama(app: QuartTrio, view: RouterView) -> None:
    @app.route("/api/version")
    async def version() -> Response:
        return _json(version_document())

    @app.route("/api/tags")
    async def tags() -> Response:
        config = view.config
        client = current_client()
        entries = [
            await tag_entry(config, view, name, target)
            for name, target in names(config, view)
            if usable(config, client, target, name)
        ]
        return _json({"models": entries})

    @app.route("/api/ps")
    async def ps() -> Response:
        config = view.config
        client = current_client()
        entries = [e for e in await ps_entries(config, view) if usable(config, client, e["name"])]
        return _json({"models": entries})

    @app.route("/api/show", methods=["POST"])
    async def show() -> Response:
        try:
            body = parse_object(await read_body())
        except BodyError as exc:
            return _error(400, str(exc))
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            return _error(400, 'name the model: {"model": "NAME"}')
        config = view.config
        found = await show_document(config, view, name)
        if found is None:
            return _error(404, unknown_model_message(name, (*config.models, *config.pools)))
        target, doc = found
        refusal = scope_refusal(config, current_client(), target, name)
        if refusal is not None:
            return _error(refusal.status, refusal.message)
        return _json(doc)

    @app.route("/api/<path:rest>", methods=["GET", "POST", "PUT", "DELETE", "HEAD"])
    async def other(rest: str) -> Response:
        path = "/api/" + rest
        if path in PATHS:
            return _error(405, f"{path} takes POST with a JSON body")
        if any(path == m or path.startswith(m + "/") for m in MANAGEMENT):
            message = (
                f"{path} is not offered here: the models this router serves are GGUF files named in its "
                "config (add a [models.NAME] table, or serve a folder with --models-dir, then reload)"
            )
            return _error(501, message)
        return _error(404, f"{path} is not part of the API served here; see /api/tags for the models")
