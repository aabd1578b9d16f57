"""The OpenAPI document and the documentation UIs, served offline from `doq/service/static`.

`/docs` (Swagger UI) and `/redoc` load only same-origin assets under `/static/`: no CDN,
no web fonts, no validator badge. `build_openapi` post-processes FastAPI's document:
manual request bodies are added to the components, the default 422 answers (we answer
400 problem+json) and their schemas are removed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from pydantic.json_schema import models_json_schema
from starlette.responses import HTMLResponse

from doq.service.http import models as m
from doq.service.http.bodies import BODY_MODELS

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
REF = "#/components/schemas/{model}"


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI 3 document (cached on the app)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description,
        routes=getattr(app.state, "openapi_routes", app.routes),
        tags=app.openapi_tags, separate_input_output_schemas=False,
    )
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    models = [(model, "validation") for model in BODY_MODELS.values()]
    models.append((m.Problem, "serialization"))
    _, defs = models_json_schema(models, ref_template=REF)  # type: ignore[arg-type]
    for name, schema in defs.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    for path_item in doc.get("paths", {}).values():
        for op in path_item.values():
            if isinstance(op, dict):
                op.get("responses", {}).pop("422", None)
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    app.openapi_schema = doc
    return doc


def install_docs(app: FastAPI) -> None:
    """Mount `/static`, `/docs` (Swagger UI), `/redoc` and the cached `/openapi.json`."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - Swagger UI",
            swagger_js_url="/static/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger-ui.css",
            swagger_favicon_url="/static/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None, "tryItOutEnabled": True},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - ReDoc",
            redoc_js_url="/static/redoc.standalone.js",
            redoc_favicon_url="/static/favicon-32x32.png",
            with_google_fonts=False,
        )
