"""The one module of FedGMR that touches Flower's API.

Flower's Message API (``Grid``, ``Message``, records) moves between minor releases, so
everything else in :mod:`fedgmr.flower` talks to the small interface defined here:

* :class:`GridLink` - push a train instruction to a node, pull whatever replies have
  arrived, list the connected nodes;
* :func:`fields_of` / :func:`content_of` - a FedGMR field dict <-> a message's
  ``RecordDict`` (one ``ConfigRecord`` of scalars and raw ``bytes``; never pickle);
* :func:`make_server_app` / :func:`make_client_app` - the ``ServerApp`` / ``ClientApp``
  objects with our entry points registered.

Tested with the Flower range in :data:`SUPPORTED` (see ``pyproject.toml``'s ``flower``
extra); other versions get a warning, not a refusal.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Iterable, Mapping, Sequence

from fedgmr.flower.payload import RECORD

log = logging.getLogger(__name__)

#: Flower minor versions this adapter was tested with
SUPPORTED = ((1, 42),)
TRAIN = "train"  # Flower's MessageType.TRAIN

try:
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("fedgmr.flower needs Flower: pip install 'fedgmr[flower]'") from exc


def flower_version() -> str:
    try:
        return version("flwr")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"


def check_version() -> None:
    """Warn once when the installed Flower is outside the tested range."""
    v = flower_version()
    try:
        major, minor = (int(p) for p in v.split(".")[:2])
    except ValueError:
        return
    if (major, minor) not in SUPPORTED:
        log.warning("fedgmr.flower was tested with flwr %s; found %s",
                    ", ".join(f"{a}.{b}" for a, b in SUPPORTED), v)


# ---------------------------------------------------------------------- records
def content_of(fields: Mapping[str, Any]) -> RecordDict:
    """A message body holding FedGMR's fields in one ConfigRecord."""
    return RecordDict({RECORD: ConfigRecord(dict(fields))})


def fields_of(message: Message) -> dict[str, Any]:
    """FedGMR's fields of a message (empty when it has none or carries an error)."""
    if message.has_error() or not message.has_content():
        return {}
    rec = message.content.get(RECORD)
    if rec is None or not isinstance(rec, ConfigRecord):
        return {}
    return dict(rec)


def reply(message: Message, fields: Mapping[str, Any]) -> Message:
    """A reply to ``message`` carrying ``fields``."""
    return Message(content_of(fields), reply_to=message)


@dataclass
class Arrived:
    """One reply pulled from the SuperLink."""

    instruction_id: str  # the id push() returned for the instruction it answers
    node_id: int
    fields: dict[str, Any]
    error: str | None  # Flower's error (client crashed, TTL expired, ...) or None
    nbytes: int  # size of the FedGMR fields' byte values
    received: float | None = None  # epoch seconds (time.time()) when the pull returned it complete


# ---------------------------------------------------------------------- grid
class GridLink:
    """Push/pull over a Flower ``Grid``; what the FedGMR server loop sees of Flower.

    Pulling never blocks the server loop. Flower hands the ServerApp a reply as soon as
    its metadata reached the SuperLink and then pulls the reply's objects, retrying with
    backoff (1 s, doubling, at most 10 s) until the client's upload has finished: over a
    slow uplink one ``pull_messages`` call waits for the slowest reply in it (the testbed
    measured 8-30 s). So each awaited instruction is pulled on its own, in a small thread
    pool (``pull_workers``; 0: every pull in the caller, blocking): :meth:`pull` returns
    the replies whose pulls have finished and starts a new pull for an instruction whose
    last one came back empty at most every ``repoll`` seconds.
    """

    def __init__(self, grid: Grid, pull_workers: int = 8, repoll: float = 0.25,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.grid = grid
        self.repoll = repoll
        self.clock = clock
        self._pool = (ThreadPoolExecutor(max_workers=pull_workers, thread_name_prefix="fedgmr-pull")
                      if pull_workers > 0 else None)
        self._pulls: dict[str, Future[list[Arrived]]] = {}  # instruction id -> its pull in flight
        self._started: dict[str, float] = {}  # instruction id -> when its last pull started
        self._restore: list[Callable[[], None]] = []  # undo cap_pull_backoff on close

    def cap_pull_backoff(self, seconds: float) -> bool:
        """Make the grid ask again for a reply's objects that are not at the SuperLink yet
        after at most ``seconds`` (Flower 1.42's ``HttpGrid.pull_messages`` backs off 1 s,
        doubling to 10 s, through its module's ``pull_objects``): that module's name is
        replaced until :meth:`close` (the ServerApp's process runs one run). Returns whether
        the grid pulls that way; a grid that does not (the simulation runtime's in-memory
        grid) is left as it is."""
        from fedgmr.flower.fast_supernode import capped_backoff

        module = sys.modules.get(type(self.grid).__module__)
        original = module.__dict__.get("pull_objects") if module is not None else None
        if not callable(original):
            return False
        module.pull_objects = capped_backoff(getattr(original, "__wrapped_pull__", original), seconds)
        self._restore.append(lambda: setattr(module, "pull_objects", original))
        return True

    def node_ids(self) -> list[int]:
        return sorted(int(n) for n in self.grid.get_node_ids())

    def wait_for_nodes(self, count: int, timeout: float, poll: float = 0.5) -> list[int]:
        """Nodes connected once ``count`` are, or when ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        nodes = self.node_ids()
        while len(nodes) < count and time.monotonic() < deadline:
            time.sleep(poll)
            nodes = self.node_ids()
        return nodes

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
        """Send a train instruction; returns its id ('' when Flower refused it)."""
        msg = Message(content_of(fields), dst_node_id=int(node_id), message_type=TRAIN, ttl=float(ttl),
                      group_id=group)
        ids = list(self.grid.push_messages([msg]))
        return str(ids[0]) if ids else ""

    def pull(self, instruction_ids: Iterable[str]) -> list[Arrived]:
        """Replies that have arrived for these instructions (never waits for an upload in
        progress; an error raised by a pull is raised here)."""
        ids = [i for i in instruction_ids if i]
        if self._pool is None:
            return self.pull_now(ids)
        out: list[Arrived] = []
        for i, fut in list(self._pulls.items()):
            if fut.done():
                del self._pulls[i]
                out += fut.result()
        got = {a.instruction_id for a in out}
        now = self.clock()
        for i in ids:
            if i in self._pulls or i in got or now - self._started.get(i, -math.inf) < self.repoll:
                continue
            self._started[i] = now
            self._pulls[i] = self._pool.submit(self.pull_now, [i])
        # forget the instructions no longer awaited (answered, expired) unless a pull of theirs still runs
        wanted = set(ids) - got
        self._started = {i: t for i, t in self._started.items() if i in wanted or i in self._pulls}
        return out

    def pull_now(self, instruction_ids: Sequence[str]) -> list[Arrived]:
        """Pull the replies to these instructions in this thread (blocking while a reply's
        upload is still in progress)."""
        ids = [i for i in instruction_ids if i]
        if not ids:
            return []
        out = []
        messages = list(self.grid.pull_messages(ids))
        received = time.time()  # the reply and its objects are at the server now
        for msg in messages:
            md = msg.metadata
            err = None
            if msg.has_error():
                err = f"code {msg.error.code}: {msg.error.reason}"
            fields = fields_of(msg)
            nbytes = sum(len(v) for v in fields.values() if isinstance(v, bytes))
            out.append(Arrived(str(md.reply_to_message_id), int(md.src_node_id), fields, err, nbytes, received))
        return out

    def close(self) -> None:
        """Stop pulling (pulls in progress are abandoned)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pulls.clear()
        while self._restore:
            self._restore.pop()()


# ---------------------------------------------------------------------- apps
def make_server_app(main: Callable[[GridLink, Mapping[str, Any]], None]) -> ServerApp:
    """A ServerApp whose main calls ``main(link, run_config)``."""
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        check_version()
        link = GridLink(grid)
        try:
            main(link, dict(context.run_config))
        finally:
            link.close()

    return app


ClientHandler = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any], int, dict[str, Any]],
                         dict[str, Any]]
#: the record of ``Context.state`` holding the node's client state (see :mod:`fedgmr.flower.client`)
STATE_RECORD = "fedgmr.state"
#: a fault-injection hook: (fields of the reply, node_config, count of replies so far) -> fields or raise
ReplyMod = Callable[[dict[str, Any], Mapping[str, Any], int], dict[str, Any]]


def make_client_app(train: ClientHandler, mods: Sequence[ReplyMod] = ()) -> ClientApp:
    """A ClientApp whose train handler calls ``train(fields, run_config, node_config,
    node_id, store) -> reply fields``; each of ``mods`` may rewrite the reply fields
    (faults for tests) before they are sent.

    ``store`` is a flat dict of scalars and bytes that persists across the messages of a
    run on this node: it lives in ``Context.state`` (record :data:`STATE_RECORD`), which
    the SuperNode keeps between messages and hands to each ClientApp process, and it is
    written back only after ``train`` returned (a message that fails leaves it as it was)."""
    app = ClientApp()

    @app.train()
    def _train(msg: Message, context: Context) -> Message:
        # replies so far on this node in this run (Context.state persists across messages)
        state = context.state.get(RECORD)
        count = int(state["replies"]) if isinstance(state, ConfigRecord) and "replies" in state else 0
        context.state[RECORD] = ConfigRecord({"replies": count + 1})
        held = context.state.get(STATE_RECORD)
        store = dict(held) if isinstance(held, ConfigRecord) else {}
        fields = train(fields_of(msg), dict(context.run_config), dict(context.node_config), int(context.node_id),
                       store)
        if store or held is not None:
            context.state[STATE_RECORD] = ConfigRecord(store)
        for mod in mods:
            fields = mod(fields, dict(context.node_config), count)
        return reply(msg, fields)

    return app
