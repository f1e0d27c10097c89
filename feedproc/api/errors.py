"""How the API answers errors: always `{"error": "..."}` (plus `reason` for a stale claim), with the
status the error carries. `ApiError` is what routes raise for the HTTP layer's own refusals; a
`FeedprocError` from `Feed` maps to its `http_status`; schema mismatches are 422 (400 when the body
is not JSON at all); Starlette's own errors (404 for an unknown path, 405) keep their status."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.errors import FeedprocError, StaleClaim

#: The type of a schema error whose message `said` wrote, in the command line's words.
SAID = "feedproc_said"


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


def said(what_it_must_be: Callable[[Any], str]) -> WrapValidator:
    """A field's validator that keeps its schema (and the OpenAPI document) but answers a value that
    does not fit with one message, `what_it_must_be(value)`, in the command line's words: a union
    (a gate's number or name) would otherwise say why each member refused it, under the member's
    name (`items.0.gate.constrained-int: ...; items.0.gate.constrained-str: ...`)."""

    def validate(value: Any, fits: ValidatorFunctionWrapHandler) -> Any:
        try:
            return fits(value)
        except ValidationError:
            raise PydanticCustomError(SAID, "{message}", {"message": what_it_must_be(value)}) from None

    return WrapValidator(validate)


def got(value: Any) -> str:
    """A value an error message quotes, as JSON (the request's own spelling), cut short."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def where(loc: Sequence[int | str]) -> str:
    """A problem's place in the request as a JSON path: `items[0].gate` (the body is the root;
    `query.limit` for a query parameter)."""
    path = ""
    for part in loc:
        if part == "body":
            continue
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """422 names what is wrong with a well-formed request; a body that is not JSON at all is a 400."""
    if any(problem.get("type") == "json_invalid" for problem in error.errors()):
        return _error(400, "the request body is not valid JSON")
    problems = []
    for problem in error.errors()[:5]:
        place, message = where(problem.get("loc", ())), problem.get("msg", "invalid")
        if problem.get("type") == SAID:
            problems.append(f"{place} {message}")  # "items[0].gate must be an integer >= 0 ..."
        else:
            problems.append(f"{place}: {message}" if place else message)
    return _error(422, "; ".join(problems) or "invalid request")


async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    return _error(error.status_code, str(error.detail), getattr(error, "headers", None))
