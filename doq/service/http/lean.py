"""`LeanRoute`: a FastAPI route without per-request dependency solving (the hot paths).

FastAPI resolves every handler parameter per request through its dependency machinery
(one pydantic validation per parameter, a sub-`Response`, exit stacks): on the dequeue
path (a path parameter and three query parameters) that was about a third of the
gateway's CPU per request. A `LeanRoute` is declared exactly like an `APIRoute` (the
signature still produces the OpenAPI parameters) but calls the endpoint directly:

- `request: Request`, if declared;
- path parameters as the raw strings (they must be plain `str`; the handlers and the
  service validate them, as before);
- query parameters validated in one pass by a pydantic model built once from their
  declarations (same types, bounds and defaults; lax string conversion as FastAPI's);
  an invalid one is a 400 problem naming `["query", <name>]`.

A route whose endpoint needs anything else (dependencies, body/form/file parameters,
headers, cookies, background tasks) keeps FastAPI's handler.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from starlette.responses import Response

from doq.service.http.problems import from_validation_errors


def _is_lean(route: APIRoute) -> bool:
    d = route.dependant
    if (d.dependencies or d.header_params or d.cookie_params or d.body_params or route.body_field is not None
            or d.background_tasks_param_name or d.response_param_name or d.http_connection_param_name
            or d.websocket_param_name or d.security_scopes_param_name):
        return False
    return all(f.field_info.annotation is str and not f.field_info.metadata for f in d.path_params)


def _query_model(route: APIRoute) -> type[BaseModel] | None:
    params = route.dependant.query_params
    if not params:
        return None
    fields: dict[str, Any] = {f.name: (f.field_info.annotation, f.field_info) for f in params}
    return create_model(  # type: ignore[call-overload, no-any-return]
        f"{route.name}_query", __config__=ConfigDict(extra="ignore"), **fields
    )


class LeanRoute(APIRoute):
    """An `APIRoute` calling its endpoint directly (see the module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        if not _is_lean(self):
            return super().get_route_handler()
        endpoint = self.endpoint
        request_name = self.dependant.request_param_name
        query = _query_model(self)
        names = [f.name for f in self.dependant.query_params]

        async def handler(request: Request) -> Response:
            kwargs: dict[str, Any] = dict(request.path_params)
            if query is not None:
                try:
                    q = query.model_validate(dict(request.query_params))
                except ValidationError as e:
                    raise from_validation_errors(e.errors(), ("query",)) from None
                for name in names:
                    kwargs[name] = getattr(q, name)
            if request_name:
                kwargs[request_name] = request
            return await endpoint(**kwargs)  # type: ignore[no-any-return]

        return handler
