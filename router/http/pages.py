"""The router's own browser pages besides the dashboard: ``/translate``, the ``/chat`` index and ``/talk``.

Routes:

- ``GET /translate``: pick a model, paste text, choose a target language; the translation streams in from
  ``/v1/chat/completions`` and a stop button aborts it.
- ``GET /chat``: every model with its replicas and their state (from ``/v1/models`` and ``/status``); a
  ready replica links to its llama-server's own web UI through ``/chat/{model}/``
  (``router.http.chat_page``), or to ``/talk`` when that build serves no web UI (``/chat/{model}/``
  answers 404).
- ``GET /talk?model=NAME``: a minimal chat of ours (a conversation, streamed replies, a stop button).
- ``GET /pages/{file}``: the pages' scripts and style sheet.

The pages hold no data: they read the API from the browser with the same key handling as the dashboard (a
key asked for on 401 and kept in the browser's local storage), with same-origin relative URLs only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from quart import Response
from quart_trio import QuartTrio

from router.http.errors import HttpCode, error_response

STATIC = Path(__file__).resolve().with_name("static")
PAGES = {"/translate": "translate.html", "/chat": "chat.html", "/talk": "talk.html"}
ASSETS = {
    "pages.css": "text/css; charset=utf-8",
    "pages.js": "text/javascript; charset=utf-8",
    "translate.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "talk.js": "text/javascript; charset=utf-8",
}
# The dashboard's files, served at /dash/NAME (router.http.dash).
DASH_FILES = {
    "dash.html": "text/html; charset=utf-8",
    "dash.js": "text/javascript; charset=utf-8",
    "dash.css": "text/css; charset=utf-8",
    "dash-plan.js": "text/javascript; charset=utf-8",
    "dash-rpc.js": "text/javascript; charset=utf-8",
}
# The pages and their files hold no data, so they are served without an API key (router.http.admission).
OPEN_PATHS = (
    *PAGES,
    *(f"/pages/{name}" for name in ASSETS),
    "/dash",
    *(f"/dash/{name}" for name in DASH_FILES if name != "dash.html"),
)


def _file(name: str, content_type: str) -> Response:
    response = Response((STATIC / name).read_bytes(), content_type=content_type)
    response.headers["Cache-Control"] = "no-cache"
    return response


def _page(name: str) -> Callable[[], Awaitable[Response]]:
    async def view() -> Response:
        return _file(name, "text/html; charset=utf-8")

    return view


def register_pages(app: QuartTrio) -> None:
    for path, name in PAGES.items():
        app.add_url_rule(path, endpoint=f"page:{path}", view_func=_page(name), methods=["GET"])

    @app.route("/chat/")
    async def chat_index_slash() -> Response:
        return Response("", status=308, headers={"Location": "../chat"})

    @app.route("/pages/<name>")
    async def page_file(name: str) -> Response:
        if name not in ASSETS:
            return error_response(HttpCode.NOT_FOUND, f"no page file '{name}'")
        return _file(name, ASSETS[name])
