"""How the API answers errors: always `{"error": "..."}` (plus `reason` for a stale claim), with the
status the error carries. `ApiError` is what routes raise for the HTTP layer's own refusals; a
`FeedprocError` from `Feed` maps to its `http_status`; schema mismatches are 422 (400 when the body
is not JSON at all); Starlette's own errors (404 for an unknown path, 405) keep their status."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.errors import FeedprocError, StaleClaim


class ApiError(Exception):
    """An error answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error `app` raises or meets as `{"error": ...}` with its status."""
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(FeedprocError, _feedproc_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    return _error(error.status, str(error), error.headers)


async def _feedproc_error(request: Request, error: FeedprocError) -> JSONResponse:
    if isinstance(error, StaleClaim):
        return JSONResponse({"error": str(error), "reason": error.reason}, status_code=error.http_status)
    return _error(error.http_status, str(error))


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """422 names what is wrong with a well-formed request; a body that is not JSON at all is a 400."""
    if any(problem.get("type") == "json_invalid" for problem in error.errors()):
        return _error(400, "the request body is not valid JSON")
    problems = []
    for problem in error.errors()[:5]:
        where = ".".join(str(part) for part in problem.get("loc", ()) if part != "body")
        problems.append(f"{where}: {problem.get('msg', 'invalid')}" if where else problem.get("msg", "invalid"))
    return _error(422, "; ".join(problems) or "invalid request")


async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    return _error(error.status_code, str(error.detail), getattr(error, "headers", None))
