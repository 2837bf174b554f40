#!/usr/bin/env python3
"""A leasehold producer written in Python, from the documentation only (schemas/README.md and the gateway's events).

It publishes documented JSON commands straight to JetStream (nats-py) and reads their outcomes from the gateway's
`GET /v1/events?key=<agent>&from=<seq>` (server-sent events), with nothing but the standard library besides nats-py:

1. `op.allocate` of a fresh resource on AGENT (the agent runs already; nothing is registered here);
2. `op.acquire` of a fresh lease on it, published right after the allocation (so usually decided while the resource
   is still pending); its outcome says `lease-granted` (the lease token is the position of that
   effect: `first_position` + its index), or `lease-waiting` while the resource is pending, in which case the grant
   comes later, in the outcome of the agent's report that the resource was created;
3. `op.release-lease` with that token, then `op.release` of the resource; both must be accepted.

It prints one JSON line with what it learned and exits 0; any failure exits 1 with a message on stderr. Everything
is bounded by an overall timeout (60 s unless --timeout says otherwise).

Usage: producer.py --nats nats://127.0.0.1:4222 --gateway http://127.0.0.1:7420 --agent w1
(or the environment variables LH_NATS_URL, LH_GATEWAY_URL, LH_AGENT).
"""

import argparse
import asyncio
import json
import os
import queue
import secrets
import sys
import threading
import time
import urllib.parse
import urllib.request

import nats
from nats.errors import TimeoutError as NatsTimeout

ISSUER = "py-producer"


class Failure(Exception):
    """What went wrong, for the message on stderr."""


def uuid7() -> str:
    """A UUIDv7 (RFC 9562) in its canonical text: 48 bits of Unix milliseconds, the version 7, 12 random bits, the
    variant bits 10, 62 random bits; lower-case hex with hyphens."""
    ms = time.time_ns() // 1_000_000
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= secrets.randbits(12) << 64
    value |= 0b10 << 62
    value |= secrets.randbits(62)
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def envelope(type_name: str, body: dict) -> dict:
    """A complete command envelope of class `op` (the prefix of its type)."""
    return {
        "schema_version": 1,
        "type": type_name,
        "command_id": uuid7(),
        "class": type_name.split(".", 1)[0],
        "issuer": ISSUER,
        "issued_at": time.time_ns() // 1_000_000,
        "correlation_id": None,
        "causation_id": None,
        "body": body,
    }


class Events:
    """The gateway's outcome feed for one key, read line by line on a thread (urllib blocks); events arrive on a
    queue as (seq, outcome), or ("error", message) when the stream fails or ends."""

    def __init__(self, gateway: str, key: str, start: int):
        query = urllib.parse.urlencode({"key": key, "from": start})
        self.url = f"{gateway.rstrip('/')}/v1/events?{query}"
        self.queue: "queue.Queue[tuple]" = queue.Queue()
        self.thread = threading.Thread(target=self._read, name="events", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            request = urllib.request.Request(self.url, headers={"Accept": "text/event-stream"})
            # The socket timeout bounds each read; the server sends a keep-alive comment now and then.
            with urllib.request.urlopen(request, timeout=30) as response:
                kind = response.headers.get("Content-Type", "")
                if not kind.startswith("text/event-stream"):
                    raise Failure(f"{self.url} answered {response.status} {kind!r}, not an event stream")
                event, data = None, []
                for raw in response:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line == "":
                        if data:
                            self._dispatch(event or "message", "\n".join(data))
                        event, data = None, []
                    elif line.startswith(":"):
                        continue  # a comment: keep-alive
                    else:
                        field, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if field == "event":
                            event = value
                        elif field == "data":
                            data.append(value)
                        # `id` is the outcome sequence, also in the data; `retry` does not matter here.
            self.queue.put(("error", f"the event stream {self.url} ended"))
        except Exception as e:  # noqa: BLE001 - anything here is a failure to report to the main task
            self.queue.put(("error", f"reading {self.url}: {e}"))

    def _dispatch(self, event: str, data: str) -> None:
        if event == "outcome":
            message = json.loads(data)
            self.queue.put((message["seq"], message["outcome"]))
        elif event == "error":
            self.queue.put(("error", f"the gateway says: {data}"))

    async def next(self, deadline: float) -> tuple:
        """The next outcome, as (seq, outcome); fails at `deadline` (a `time.monotonic()` value)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Failure("the overall timeout ran out while waiting for an outcome")
        try:
            item = await asyncio.to_thread(self.queue.get, True, remaining)
        except queue.Empty:
            raise Failure("the overall timeout ran out while waiting for an outcome") from None
        if item[0] == "error":
            raise Failure(item[1])
        return item


def effects(outcome: dict):
    """The (position, name, fields) of each effect of an accepted outcome; nothing for a rejection."""
    accepted = outcome["decision"].get("accepted")
    if accepted is None:
        return
    first = accepted["first_position"]
    for index, effect in enumerate(accepted["effects"]):
        ((name, fields),) = effect.items()
        yield first + index, name, fields


class Producer:
    def __init__(self, js, events: Events, agent: str, deadline: float):
        self.js = js
        self.events = events
        self.agent = agent
        self.deadline = deadline
        # Outcomes seen, by command id: the answer to each command is looked up here.
        self.outcomes: dict = {}
        # Lease ids -> (token, outcome seq) of their grant, and the lease ids that ended.
        self.grants: dict = {}
        self.ended: dict = {}

    async def publish(self, command: dict, subject_id: str) -> int:
        """JetStream publish on `lh.in.<class>.<key>.<id>`, with `Nats-Msg-Id` = the command id; answers the
        command's sequence in the command stream. A timeout is retried with the same bytes (same id)."""
        subject = f"lh.in.{command['class']}.{self.agent}.{subject_id}"
        payload = json.dumps(command, separators=(",", ":")).encode("utf-8")
        headers = {"Nats-Msg-Id": command["command_id"], "Content-Type": "application/json"}
        while True:
            try:
                ack = await self.js.publish(subject, payload, timeout=5, headers=headers)
                return ack.seq
            except NatsTimeout:
                if time.monotonic() > self.deadline:
                    raise Failure(f"publishing {command['type']} on {subject}: no acknowledgement") from None

    def _record(self, seq: int, outcome: dict) -> None:
        command_id = outcome["command"]["id"]
        self.outcomes.setdefault(command_id, []).append((seq, outcome))
        for position, name, fields in effects(outcome):
            if name == "lease-granted":
                self.grants[fields["lease"]] = (position, seq)
            elif name in ("lease-released", "lease-broken", "lease-expired", "lease-failed"):
                self.ended[fields["lease"]] = name

    async def until(self, done):
        """Reads outcomes until `done()` answers something other than None, and answers it."""
        while True:
            answer = done()
            if answer is not None:
                return answer
            seq, outcome = await self.events.next(self.deadline)
            self._record(seq, outcome)

    async def outcome_of(self, command: dict) -> tuple:
        """The (seq, outcome) of `command` (every part of it read, when it has several)."""

        def decided():
            parts = self.outcomes.get(command["command_id"])
            if not parts:
                return None
            last = parts[-1][1]
            if any(name == "decision-continues" for _, name, _ in effects(last)):
                return None
            return parts[0]

        return await self.until(decided)

    async def accepted(self, command: dict) -> tuple:
        seq, outcome = await self.outcome_of(command)
        rejected = outcome["decision"].get("rejected")
        if rejected is not None:
            raise Failure(f"{command['type']} {command['command_id']} was rejected: {rejected['kind']}: "
                          f"{rejected['message']}")
        return seq, outcome


async def run(args) -> dict:
    deadline = time.monotonic() + args.timeout
    agent = args.agent
    events = Events(args.gateway, agent, 1)
    nc = await nats.connect(args.nats, connect_timeout=5, max_reconnect_attempts=3)
    try:
        js = nc.jetstream()
        producer = Producer(js, events, agent, deadline)

        resource = uuid7()
        allocate = envelope("op.allocate", {
            "agent": agent,
            "resource": resource,
            "kind": "container",
            "capacity": 1,
            "attributes": {"made-by": "producer.py"},
            "parent": None,
            "pools": [],
        })
        allocate_seq = await producer.publish(allocate, resource)

        lease = uuid7()
        acquire = envelope("op.acquire", {
            "agent": agent,
            "resource": resource,
            "lease": lease,
            "holder": ISSUER,
            "ttl": None,
            "wait_timeout": None,
        })
        # Published right after the allocation, without waiting for its outcome: the partition decides its commands
        # in log order, so the acquire comes after the allocate, most likely while the resource is still pending.
        await producer.publish(acquire, lease)
        allocated_at, allocated = await producer.accepted(allocate)
        if not any(name == "resource-allocated" and fields["resource"] == resource
                   for _, name, fields in effects(allocated)):
            raise Failure(f"op.allocate was accepted without resource-allocated: {allocated}")
        acquired_at, acquired = await producer.accepted(acquire)
        said = [name for _, name, fields in effects(acquired) if fields.get("lease") == lease]
        if not said or said[0] not in ("lease-granted", "lease-waiting"):
            raise Failure(f"op.acquire was accepted without lease-granted or lease-waiting: {acquired}")
        waited = said[0] == "lease-waiting"

        def granted():
            if lease in producer.ended:
                raise Failure(f"lease {lease} ended ({producer.ended[lease]}) before it was granted")
            return producer.grants.get(lease)

        token, granted_at = await producer.until(granted)

        release_lease = envelope("op.release-lease", {"agent": agent, "lease": lease, "token": token})
        await producer.publish(release_lease, lease)
        released_lease_at, released_lease = await producer.accepted(release_lease)
        if not any(name == "lease-released" and fields["lease"] == lease
                   for _, name, fields in effects(released_lease)):
            raise Failure(f"op.release-lease was accepted without lease-released: {released_lease}")

        release = envelope("op.release", {"agent": agent, "resource": resource, "reason": "producer.py is done"})
        await producer.publish(release, resource)
        released_at, released = await producer.accepted(release)
        if not any(name == "resource-releasing" and fields["resource"] == resource
                   for _, name, fields in effects(released)):
            raise Failure(f"op.release was accepted without resource-releasing: {released}")

        return {
            "agent": agent,
            "resource": f"{agent}.{resource}",
            "lease": f"{agent}.{lease}",
            "token": token,
            "waited": waited,
            "allocate": {"command_id": allocate["command_id"], "command_seq": allocate_seq,
                         "outcome_seq": allocated_at},
            "acquire": {"command_id": acquire["command_id"], "outcome_seq": acquired_at},
            "granted_seq": granted_at,
            "release_lease": {"command_id": release_lease["command_id"], "outcome_seq": released_lease_at},
            "release": {"command_id": release["command_id"], "outcome_seq": released_at},
        }
    finally:
        await nc.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats", default=os.environ.get("LH_NATS_URL"), help="NATS URL (LH_NATS_URL)")
    parser.add_argument("--gateway", default=os.environ.get("LH_GATEWAY_URL"), help="gateway URL (LH_GATEWAY_URL)")
    parser.add_argument("--agent", default=os.environ.get("LH_AGENT"), help="the agent's name (LH_AGENT)")
    parser.add_argument("--timeout", type=float, default=60.0, help="overall timeout in seconds (default 60)")
    args = parser.parse_args()
    for name in ("nats", "gateway", "agent"):
        if not getattr(args, name):
            parser.error(f"--{name} is required (or its environment variable)")
    try:
        learned = asyncio.run(asyncio.wait_for(run(args), args.timeout + 5))
    except Failure as e:
        print(f"producer.py: {e}", file=sys.stderr)
        return 1
    except (asyncio.TimeoutError, Exception) as e:  # noqa: BLE001 - every failure exits non-zero with its message
        print(f"producer.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(learned), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
