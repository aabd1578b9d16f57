"""The HTTP/JSON gateway, split into small modules; `doq.service.http_gateway.create_app` assembles it.

- `models`: pydantic request/response models (the OpenAPI document) and JSON encoders.
- `problems`: `application/problem+json` errors and the exception handlers.
- `bodylimit`: an ASGI middleware that bounds request bodies (413 before the app runs).
- `routes`: the queue and message endpoints; `ops`: health, metrics, backup/restore.
- `docs`: `/openapi.json`, Swagger UI and ReDoc served from local assets.
"""
