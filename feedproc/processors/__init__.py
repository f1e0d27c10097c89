"""Processors: what a watcher hands each item to.

A Processor turns an `Item` into a `Response`, or raises: `PermanentError` fails the item at once,
`RetryLater` / `InvalidAnswer` / any other exception is a transient failure (retried with backoff).
`HTTPProcessor` is the default, speaking the HTTP handler contract; `load_processor` resolves
`--processor module:attr`.

`calling` holds the seam (ProcessorLike, Processor, call_processor, call_batch, load_processor),
`transactional` the processors that complete in their answer's transaction (apart: it names
SQLAlchemy's types, and the pull worker needs no database),
`http` the HTTP processor and the request side of the contract, `answers` the answer side.
"""

from .answers import (
    BODY_KEPT,
    answer_from_object,
    parse_json,
    parse_retry_after,
    read_answer,
    read_batch_answer,
    response_from_json,
)
from .calling import Processor, ProcessorLike, call_batch, call_processor, load_processor
from .http import (
    ACCEPT_ENCODING,
    JSON_CONTENT,
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    HTTPOptions,
    HTTPProcessor,
    UndecodableAnswer,
    read_body,
    request_body,
)

__all__ = [
    "ACCEPT_ENCODING",
    "BODY_KEPT",
    "JSON_CONTENT",
    "MAX_ANSWER_BYTES",
    "AnswerTooLarge",
    "HTTPOptions",
    "HTTPProcessor",
    "Processor",
    "ProcessorLike",
    "UndecodableAnswer",
    "answer_from_object",
    "call_batch",
    "call_processor",
    "load_processor",
    "parse_json",
    "parse_retry_after",
    "read_answer",
    "read_batch_answer",
    "read_body",
    "request_body",
    "response_from_json",
]
