"""Responses that stream a read's body (``broker.read_budget.ReadBody``) to the client: a slice
at a time, each piece of the body reserved in the broker's read budget until it has been
written to the socket (hypercorn's send returns once the bytes are in the socket's buffer), so
that reads hold bounded memory however many run and however slowly their clients read.

The first piece is built before the response begins: a read that is refused (``LowOnMemory``:
503 with ``Retry-After``) or fails (404, 400, 503) answers its status. A body whose length is
known (the frames; a body of one piece) is sent with ``Content-Length``, another chunked. A body
that cannot go on once begun (``ReadCut``: the log changed under a streamed frame read, or a
storage error) is cut short: the app returns without ending the body, so hypercorn closes the
connection before the promised length (or the last chunk), which the client sees as an
incomplete response, never as a shorter one; one warning line says why. The body is closed
(its reservation given back) however the response ends, a client that goes away included.
"""

from __future__ import annotations

import logging

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ...broker.read_budget import ReadBody, ReadCut
from ...broker.streams.service import TopicError

log = logging.getLogger(__name__)


async def read_response(body: ReadBody, media_type: str) -> StreamingResponse:
    """The response streaming ``body``, its first piece built (errors raise from here)."""
    try:
        await body.start()
    except BaseException:
        body.close()
        raise
    return _ReadResponse(body, media_type)


class _ReadResponse(StreamingResponse):
    def __init__(self, body: ReadBody, media_type: str) -> None:
        length = body.length
        headers = {"content-length": str(length)} if length is not None else None
        super().__init__(body, media_type=media_type, headers=headers)
        self.read_body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (ReadCut, TopicError, OSError) as exc:  # the client sees a response cut short
            log.warning("%s: the response was cut short: %s", scope.get("path"), exc)
        finally:
            self.read_body.close()
