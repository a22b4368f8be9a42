"""moto's server: kept-alive connections, and the work it repeats on every request done once."""

from __future__ import annotations

import functools
import io
import selectors
import threading
from collections.abc import Iterator
from typing import Any

from moto import backends as moto_backends
from moto.core import responses as moto_responses
from moto.core import serialize as moto_serialize
from moto.moto_server import threaded_moto_server
from moto.moto_server.werkzeug_app import MotoRequestHandler
from werkzeug import serving as werkzeug_serving

from local.emulator.moto_patches.patch import Kind, Patch, Replacement


def _listed_once(original: Any) -> Any:
    return functools.cache(lambda: tuple(original()))


# .reading_done: this thread's current request body is read in full, so its connection can be kept
_keep_alive = threading.local()


class KeepAliveRequestHandler(MotoRequestHandler):
    """moto's request handler with HTTP/1.1 keep-alive: one connection (and thread) per client connection.

    werkzeug's development server answers every request with ``Connection: close``, because
    ``http.server`` cannot tell where an unread request body ends and the next request line begins;
    after each response it drains the socket for a while to discard such leftovers. Here the body is
    read in full (``Content-Length`` bytes) before the application sees it, so nothing is left to
    drain and the connection can serve the client's next request. A request whose length is not
    known up front (chunked transfer encoding) keeps werkzeug's behaviour: the answer closes the
    connection and the leftovers are drained.

    ``TCP_NODELAY``: werkzeug writes the headers and the body of a response separately; on a kept
    connection Nagle's algorithm holds the body until the client acknowledges the headers, which a
    client delays (delayed acknowledgement), so every request would wait for it.
    """

    disable_nagle_algorithm = True

    def make_environ(self) -> dict[str, Any]:
        environ = super().make_environ()
        _keep_alive.reading_done = False
        if environ.get("wsgi.input_terminated"):
            return environ  # chunked: werkzeug reads it and closes the connection afterwards
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return environ
        environ["wsgi.input"] = io.BytesIO(self.rfile.read(length) if length > 0 else b"")
        _keep_alive.reading_done = True
        return environ

    def send_header(self, keyword: str, value: str) -> None:
        closing = keyword.lower() == "connection" and value.lower() == "close"
        if closing and _keep_alive.__dict__.get("reading_done"):
            return  # http.server keeps the connection open unless the request asked to close it
        super().send_header(keyword, value)


class _NothingToDrain:
    """``werkzeug.serving``'s ``selectors`` module, except that a request whose body was read in full
    by :class:`KeepAliveRequestHandler` finds nothing to drain (what is there is the next request)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(selectors, name)

    @staticmethod
    def DefaultSelector() -> Any:  # noqa: N802 - the name werkzeug calls
        if _keep_alive.__dict__.get("reading_done"):
            return _IdleSelector()
        return selectors.DefaultSelector()


class _IdleSelector:
    def register(self, *args: Any, **kwargs: Any) -> None:
        return None

    def select(self, timeout: float | None = None) -> list[Any]:
        return []

    def close(self) -> None:
        return None


# (picker class, alias providers, member key, shape, its parent) -> the keys to try, in order; each entry
# holds its shape and parent, so their ids stay theirs while the entry lives.
_possible_keys: dict[tuple[Any, ...], tuple[Any, Any, tuple[str, ...]]] = {}
_POSSIBLE_KEYS_LIMIT = 20_000


def _possible_keys_once(original: Any) -> Any:
    def get_possible_keys(self: Any, context: Any) -> Iterator[str]:
        """Where a member's value may be found in a plain ``dict``, worked out once per member.

        For a ``dict`` the answer depends only on the member's name, its shape and that shape's parent
        (a dict has no ``Meta`` aliases and its class name is ``dict``), and the shapes are the cached
        service model's own objects, so the keys are cached under those; any other object is asked
        every time. The values are still read from the object each time.
        """
        shape = context.shape
        if type(context.obj) is not dict or shape is None:
            return iter(original(self, context))
        parent = getattr(shape, "parent", None)
        key = (type(self), tuple(self.alias_providers), context.key, id(shape), id(parent))
        entry = _possible_keys.get(key)
        if entry is None or entry[0] is not shape or entry[1] is not parent:
            if len(_possible_keys) >= _POSSIBLE_KEYS_LIMIT:
                _possible_keys.clear()
            entry = _possible_keys[key] = (shape, parent, tuple(original(self, context)))
        return iter(entry[2])

    return get_possible_keys


PATCHES = (
    Patch(
        name="server.moto_modules_listed_once",
        kind=Kind.SPEED,
        corrects="The server asks on every request whether the Host is a moto module: a directory "
        "listing and a stat call per module each time, though the installed modules do not change.",
        replaces=(Replacement(moto_backends, "list_of_moto_modules", _listed_once),),
    ),
    Patch(
        name="server.response_methods_listed_once",
        kind=Kind.SPEED,
        corrects="To find an action's method, the server lists every member of the responses class with "
        "inspect.getmembers on every request; a class's methods do not change.",
        replaces=(
            Replacement(
                moto_responses, "method_names_from_class", lambda original: functools.cache(original)
            ),
        ),
    ),
    Patch(
        name="server.keep_alive_connections",
        kind=Kind.SPEED,
        corrects="werkzeug answers every request with 'Connection: close', so every AWS request of the "
        "emulator opened a TCP connection and the server started a thread for it.",
        replaces=(
            Replacement(threaded_moto_server, "MotoRequestHandler", lambda _: KeepAliveRequestHandler),
            Replacement(werkzeug_serving, "selectors", lambda _: _NothingToDrain()),
        ),
    ),
    Patch(
        name="server.response_keys_looked_up_once",
        kind=Kind.SPEED,
        corrects="A response is serialised by walking the operation's output shape, asking for every "
        "member of every structure six alias providers (new objects each time) which keys its value "
        "may be found under, then botocore's xform_name of each: for a DynamoDB item, the ten members "
        "of each attribute's AttributeValue.",
        replaces=(
            Replacement(moto_serialize.XFormedAttributePicker, "get_possible_keys", _possible_keys_once),
        ),
        forget=_possible_keys.clear,
    ),
)
