"""What mxq assumes of kombu's Redis transport, recorded, so that a new kombu says what to re-read
instead of failing in a worker.

mxq reaches under kombu's public surface in two modules: `transport` (its channel moves an item
kombu cannot read to the dead-letter list, hooked into kombu's BRPOP reader and consumer) and
`messages` (the reconciler and dynamic batching read kombu's lists, its unacked hash and index
directly, partly inside a Lua script). `messages` reads kombu's key names and JSON form from kombu
itself; what is left, the behaviour of kombu's code, is recorded here: for each function, its
source's fingerprint (comments, formatting and docstrings left out), for each constant its value,
for kombu's JSON writer what it writes, all read from kombu `KOMBU_VERSION`. `differences` compares
a kombu module with the record, one line per thing that changed, naming what mxq assumed of it.

Upgrading Kombu
---------------
1. Install the new kombu (pyproject.toml pins it) and run `python -m mxq.workers.broker.kombu_mirror`:
   it prints a line for each recorded function or value that changed, or nothing.
2. For each line, read the new kombu code it names against what mxq assumes (`RELIANCES`) and
   adapt the mxq code it names (`transport.py`, `messages.py`); prefer a public hook of kombu or
   redis-py over a copy of kombu's code.
3. Paste the record it prints (`KOMBU_VERSION`, `RECORD`) over the one below, and run
   `tests/jobs/test_kombu_mirror.py`, `tests/jobs/test_messages.py`, `tests/jobs/test_reconcile.py` and
   `tests/bad_input/test_bad_input.py -k bad_message` (`--legs both`).
docs/kombu-upgrade.md says the same for readers of the documentation.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from types import FunctionType, ModuleType

KOMBU_VERSION = "5.7.0"
# What the JSON writer is asked to write (its text is recorded): a task id as messages carry it.
JSON_PROBE = {"headers": {"id": "job-1"}, "priority": [0, 3]}


@dataclass(frozen=True)
class Reliance:
    """One thing of kombu's that mxq relies on: where it is (an attribute path from
    `kombu.transport.redis`), who relies on it, and what they assume of it."""

    path: str
    user: str
    assumes: str


RELIANCES = (
    Reliance("Channel._brpop_read", "transport.Channel._readable",
             "the BRPOP reply is parsed by self.client.parse_response(..., 'BRPOP') (where mxq's "
             "response callback checks it), a falsy reply means nothing came, and the list's name "
             "loses its priority suffix at `sep`"),
    Reliance("Channel.client", "transport.Channel.__init__",
             "one client per channel, made once and kept, reads BRPOP: a callback set on it at "
             "start stays"),
    Reliance("Channel.basic_consume", "transport.Channel.basic_consume",
             "it calls the virtual channel's basic_consume, which installs the queue's callback"),
    Reliance("virtual.Channel.basic_consume", "transport.Channel.basic_consume",
             "the queue's callback is connection._callbacks[queue], and its first step builds "
             "self.Message(raw, channel=self), before the message is tracked or delivered"),
    Reliance("virtual.Transport._deliver", "transport.Channel.basic_consume",
             "every item read from a queue goes to connection._callbacks[queue]"),
    Reliance("Channel.Message.__init__", "messages.unreadable",
             "a message needs `properties` with a `delivery_tag`, and a body its `body_encoding` "
             "decodes"),
    Reliance("Channel.codecs", "messages.unreadable", "base64 is the only body_encoding"),
    Reliance("Channel._q_for_pri", "messages.stored_names",
             "a queue's messages of priority p > 0 are in the list '<queue><sep><p>'"),
    Reliance("Channel.sep", "messages.PRIORITY_SEP", "read from kombu: Redis keys of old messages "
             "keep the old value"),
    Reliance("Channel.priority_steps", "queues.PRIORITY_STEPS",
             "a transport option mxq sets (app.celery_config) to its own steps; kombu's default "
             "holds only the messages of an mxq from before priorities"),
    Reliance("Channel._brpop_start", "queues.PRIORITY_STEPS",
             "a consumer's BRPOP names each step's list of every queue it consumes, lowest step "
             "first: a higher level on any of a worker's queues is popped before a lower one"),
    Reliance("Channel.priority", "publish.Turn.broker_priority",
             "a message's priority maps to the highest step not above it, so each of mxq's "
             "steps is its own list"),
    Reliance("Channel.unacked_key", "messages.UNACKED",
             "read from kombu: messages held at the upgrade stay in the old hash"),
    Reliance("Channel.unacked_index_key", "messages.UNACKED_INDEX",
             "read from kombu: messages held at the upgrade stay in the old sorted set"),
    Reliance("QoS.append", "messages.look, messages.job_id, repair.reconcile._drop_unacked",
             "a delivered message is kept in the unacked hash under its delivery tag as JSON "
             "[message, exchange, routing key], its delivery time in the unacked index"),
    Reliance("dumps", "messages.JOB_ID_MARK (the look's Lua script)",
             "messages are JSON with json's default separators, so a task id reads "
             "'\"id\": \"job-N\"'; read from kombu, but the script's search assumes one such mark "
             "per message"),
)

# Fingerprints read from kombu KOMBU_VERSION (`python -m mxq.workers.broker.kombu_mirror` prints them).
RECORD = {
    "Channel._brpop_read": "source 61a2bfc9294c1c8c",
    "Channel.client": "source 8fd2f153e1fc1302",
    "Channel.basic_consume": "source fc3ea75911e38eea",
    "virtual.Channel.basic_consume": "source 16f12a6613845be6",
    "virtual.Transport._deliver": "source 2c96e712c0856871",
    "Channel.Message.__init__": "source ff6e49619a1c6a4f",
    "Channel.codecs": "keys ['base64']",
    "Channel._q_for_pri": "source ccb20428b15ae0bd",
    "Channel.sep": "value '\\x06\\x16'",
    "Channel.priority_steps": "value [0, 3, 6, 9]",
    "Channel._brpop_start": "source 5e42aad2a4741b91",
    "Channel.priority": "source b34e3f828ad59921",
    "Channel.unacked_key": "value 'unacked'",
    "Channel.unacked_index_key": "value 'unacked_index'",
    "QoS.append": "source 62a64dc288defbbc",
    "dumps": 'writes \'{"headers": {"id": "job-1"}, "priority": [0, 3]}\'',
}


def _resolve(module: ModuleType, path: str) -> object:
    """The object at `path` from `module`, as defined (a property's function, not its value);
    AttributeError when kombu has no such thing any more."""
    found: object = module
    for name in path.split("."):
        found = inspect.getattr_static(found, name)
    for unwrap in ("fget", "func", "__func__"):  # property, cached_property, static/classmethod
        found = getattr(found, unwrap, found)
    return found


def _source_digest(function: FunctionType) -> str:
    """A digest of a function's code as Python reads it: comments, blank lines, formatting and
    its docstring do not count, so only a change of what it does changes the digest."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.unparse(tree).encode()).hexdigest()[:16]


def fingerprint(module: ModuleType, path: str) -> str:
    """What is recorded of `path` in `module`: `source <digest>` for a function, `keys [...]` for
    a mapping (its values are codec objects), `writes <text>` for kombu's JSON writer, else
    `value <repr>`; `missing` when kombu has no such thing."""
    try:
        found = _resolve(module, path)
    except AttributeError:
        return "missing"
    if path == "dumps" and callable(found):
        return f"writes {found(JSON_PROBE)!r}"
    if inspect.isfunction(found):
        return f"source {_source_digest(found)}"
    if isinstance(found, dict):
        return f"keys {sorted(found)!r}"
    return f"value {found!r}"


def _line(reliance: Reliance, recorded: str, now: str) -> str:
    what = (f"kombu's {reliance.path} is gone" if now == "missing"
            else f"kombu's {reliance.path} changed its code since kombu {KOMBU_VERSION}"
            if now.startswith("source ")
            else f"kombu's {reliance.path} is now {now} (kombu {KOMBU_VERSION}: {recorded})")
    return (f"{what}; {reliance.user} assumes {reliance.assumes}: re-read it, adapt "
            f"{reliance.user}, then record it again (python -m mxq.workers.broker.kombu_mirror)")


def differences(module: ModuleType | None = None) -> list[str]:
    """One line per recorded thing of `module` (default: the installed kombu.transport.redis, or
    any module object loaded from a copy of it) that differs from the record: what changed, what
    mxq assumed of it, what to do."""
    if module is None:
        from kombu.transport import redis as installed

        module = installed
    return [_line(r, RECORD[r.path], now) for r in RELIANCES
            if (now := fingerprint(module, r.path)) != RECORD[r.path]]


def installed_differences() -> list[str]:
    """`differences` of the installed kombu, and a line when its version is not the record's."""
    import kombu

    lines = differences()
    if kombu.__version__ != KOMBU_VERSION:
        lines.append(f"kombu is {kombu.__version__}, the record was read from {KOMBU_VERSION}: check "
                     "the lines above (if any), then record it again "
                     "(python -m mxq.workers.broker.kombu_mirror)")
    return lines


def current_record() -> str:
    """The record of the installed kombu, as Python to paste over KOMBU_VERSION and RECORD."""
    import kombu
    from kombu.transport import redis as module

    rows = "".join(f"    {r.path!r}: {fingerprint(module, r.path)!r},\n" for r in RELIANCES)
    return f"KOMBU_VERSION = {kombu.__version__!r}\nRECORD = {{\n{rows}}}\n"


def main() -> int:
    """Print what changed since the record and the installed kombu's record; 1 if anything did."""
    lines = installed_differences()
    print("\n".join(lines) or f"nothing mxq relies on changed since kombu {KOMBU_VERSION}")
    print("\n# The installed kombu's record, to paste over KOMBU_VERSION and RECORD:")
    print(current_record())
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
