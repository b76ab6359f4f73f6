"""What mxq assumes of kombu, checked: the installed kombu matches the record in
`mxq.workers.broker.kombu_mirror`, a changed copy of kombu's Redis transport is named line by line,
and the hooks the transport uses instead of copies of kombu's code work on a real broker."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from kombu import Connection, Consumer, Message, Queue
from kombu.transport import redis as kombu_redis

from mxq.workers.broker import deadletters, kombu_mirror, messages
from mxq.workers.broker.redis_client import client
from mxq.workers.broker.transport import transport_url
from mxq.workers.jobs.submit import submit_many
from tests.conftest import Stack

KOMBU_REDIS = Path(kombu_redis.__file__)
BRPOP_LINE = "                dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]\n"
JSON_IMPORT = "from kombu.utils.json import dumps, loads\n"
COMPACT_DUMPS = (JSON_IMPORT + "_kombu_dumps = dumps\n\n\n"
                 "def dumps(s, **kwargs):\n"
                 "    return _kombu_dumps(s, separators=(',', ':'), **kwargs)\n")


@pytest.fixture
def kombu_copy(tmp_path: Path) -> Callable[[str, str], ModuleType]:
    """A copy of the installed kombu/transport/redis.py with `old` replaced by `new`, loaded as a
    module of its own (beside, never instead of, the real one)."""
    def load(old: str, new: str) -> ModuleType:
        source = KOMBU_REDIS.read_text()
        assert source.count(old) == 1, f"kombu {kombu_mirror.KOMBU_VERSION}'s redis.py changed: {old!r}"
        path = tmp_path / f"copy_{len(list(tmp_path.iterdir()))}.py"
        path.write_text(source.replace(old, new))
        # under kombu.transport, so that its relative imports find the real kombu
        spec = importlib.util.spec_from_file_location(f"kombu.transport._mxq_copy_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert sys.modules["kombu.transport.redis"] is kombu_redis  # the real one stays
        return module
    return load


def test_the_installed_kombu_is_the_one_recorded() -> None:
    assert kombu_mirror.installed_differences() == []
    paths = [r.path for r in kombu_mirror.RELIANCES]
    assert len(paths) == len(set(paths)) and set(paths) == set(kombu_mirror.RECORD)


def test_an_unchanged_copy_and_one_changed_only_in_comments_match(
        kombu_copy: Callable[[str, str], ModuleType]) -> None:
    assert kombu_mirror.differences(kombu_copy(BRPOP_LINE, BRPOP_LINE)) == []
    commented = BRPOP_LINE.replace("\n", "  # a comment, and a blank line after it\n\n")
    assert kombu_mirror.differences(kombu_copy(BRPOP_LINE, commented)) == []


def test_a_changed_brpop_reader_is_named(kombu_copy: Callable[[str, str], ModuleType]) -> None:
    changed = kombu_copy(BRPOP_LINE, "                dest = bytes_to_str(dest)\n")
    [line] = kombu_mirror.differences(changed)
    assert line.startswith("kombu's Channel._brpop_read changed its code since kombu 5.7.0; "
                           "transport.Channel._readable assumes "), line
    assert line.endswith("then record it again (python -m mxq.workers.broker.kombu_mirror)"), line


def test_a_changed_unacked_key_is_named_with_its_values(
        kombu_copy: Callable[[str, str], ModuleType]) -> None:
    changed = kombu_copy("    unacked_key = 'unacked'\n", "    unacked_key = 'unacked_v2'\n")
    assert kombu_mirror.differences(changed) == [
        "kombu's Channel.unacked_key is now value 'unacked_v2' (kombu 5.7.0: value 'unacked'); "
        "messages.UNACKED assumes read from kombu: messages held at the upgrade stay in the old "
        "hash: re-read it, adapt messages.UNACKED, then record it again "
        "(python -m mxq.workers.broker.kombu_mirror)"]


def test_json_written_with_other_separators_is_named(kombu_copy: Callable[[str, str], ModuleType]) -> None:
    [line] = kombu_mirror.differences(kombu_copy(JSON_IMPORT, COMPACT_DUMPS))
    assert line.startswith("kombu's dumps is now writes '{\"headers\":{\"id\":\"job-1\"}"), line
    assert "messages.JOB_ID_MARK" in line, line


def test_a_function_kombu_no_longer_has_is_named(kombu_copy: Callable[[str, str], ModuleType]) -> None:
    changed = kombu_copy("    def _q_for_pri(self, queue, pri):", "    def _queue_of(self, queue, pri):")
    [line] = kombu_mirror.differences(changed)
    assert line.startswith("kombu's Channel._q_for_pri is gone; messages.stored_names assumes"), line


@pytest.mark.both_legs
def test_messages_reads_kombus_names_and_finds_the_id_mark_in_a_real_message(isolated: Stack) -> None:
    """The names `messages` reads from kombu are the ones a real message is stored under, and the
    look's Lua script finds each job id by JOB_ID_MARK in it (once), not by parsing it in Python."""
    assert (messages.UNACKED, messages.UNACKED_INDEX) == ("unacked", "unacked_index")
    assert (messages.PRIORITY_SEP, messages.STEPS_ABOVE_0) == ("\x06\x16", (1, 2, 3, 4, 5))
    s = isolated.settings
    [job_id] = submit_many(s, "probe", [{"size": 16, "batch": 1, "repeat": 1}], "cpu:0", allow_offline=True)
    queue = str(isolated.job(job_id)["queue"]) + messages.PRIORITY_SEP + "3"  # normal, never started
    [raw] = [str(item) for item in client(s.broker).lrange(queue, 0, -1)]
    assert raw.count(messages.JOB_ID_MARK) == 1 and f'{messages.JOB_ID_MARK}{job_id}"' in raw
    ids, others = client(s.broker).register_script(messages._PAGE_IDS)(
        keys=[queue], args=[0, -1, messages.JOB_ID_MARK])
    assert (ids, others) == (str(job_id), [])


@pytest.mark.both_legs
def test_the_transport_moves_what_kombu_cannot_read_aside_and_delivers_the_rest(isolated: Stack) -> None:
    """Through kombu's own reader and consumer, with mxq's hooks: an item that is not JSON (the
    BRPOP reply's callback) and one that is no message (`Message`) go to the dead letters; the
    message behind them arrives."""
    broker, queue = isolated.settings.broker, "mxq-transport-test"
    r = client(broker)
    received: list[object] = []

    def take(body: object, message: Message) -> None:
        received.append(body)
        message.ack()

    with Connection(transport_url(broker)) as conn:
        q = Queue(queue, routing_key=queue)
        with Consumer(conn, [q], accept=["json"], callbacks=[take]):
            conn.Producer().publish({"n": 1}, routing_key=queue, serializer="json", declare=[q])
            r.rpush(queue, "\x00 not json", json.dumps({"body": "x"}))  # taken first (BRPOP: tail)
            for _ in range(40):
                if received:
                    break
                try:
                    conn.drain_events(timeout=0.25)
                except TimeoutError:
                    pass
    assert received == [{"n": 1}]
    letters = deadletters.listed(r)
    assert [(d["queue"], d["message"]) for d in letters] == [  # newest first
        (queue, "\x00 not json"), (queue, '{"body": "x"}')], letters
    assert letters[0]["reason"].startswith("not JSON: ")
    assert letters[1]["reason"] == "its envelope has no properties with a delivery_tag"
    assert r.llen(queue) == 0
