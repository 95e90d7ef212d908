"""``ingest discover``: listen to a broker, then propose a mapping file that reads what it saw.

1. Capture: subscribe (default ``#``) for ``--seconds`` or ``--max-messages``; retained
   messages arrive first.
2. Recognise: each shipped preset runs over the capture through the real mapping engine;
   one that stores messages and rejects (almost) none is proposed as ``--preset NAME``.
3. Propose: the messages no given rule, file or preset takes are grouped into topic
   patterns (:mod:`ingest.devices.discover.patterns`), completed with what Home Assistant discovery
   configs, Homie attributes, the payloads' device ids and the devices a message lists
   say (:mod:`ingest.devices.discover.propose`), and narrowed until none
   takes a topic a preset handles (:mod:`ingest.devices.discover.shadowing`): a mapping file's
   rules are tried before any preset's. Each is written as a commented rule
   (:mod:`ingest.devices.discover.proposal`).
4. Check: the proposal is parsed as a mapping file and every captured message runs
   through the rules in the daemon's order (your file with the proposal appended, then
   the presets); each rule's comment and the stderr report give the messages and topics
   it took, stored, rejected and ignored, and what to edit.

stdout is only the proposed mapping file (valid TOML), so ``> mapping.toml`` keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TextIO

import aiomqtt

from ingest.config import parse_mqtt_url, read_secret
from ingest.devices.decode import Limits
from ingest.devices.discover import conventions
from ingest.devices.discover.chores import list_chores, merge_tail
from ingest.devices.discover.patterns import Captured, Pattern
from ingest.devices.discover.proposal import rule_text
from ingest.devices.discover.propose import propose
from ingest.devices.discover.shadowing import separate
from ingest.devices.formats import sparkplug as spb
from ingest.devices.mapping import Mapping
from ingest.devices.rules import load_file, load_preset, parse, preset_names
from ingest.errors import ConfigError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping as Env
    from collections.abc import Sequence

    from ingest.config import MqttSettings
    from ingest.devices.rules import Rule

MAX_MESSAGES = 100_000  # a hard bound on what one run keeps in memory
MAX_PAYLOAD = 64 * 1024  # payloads kept per message (larger ones are cut for analysis)
MAX_BYTES = 64 * 1024 * 1024  # payload bytes kept in all: listening stops there
PRESET_FIT = 0.9  # share of a preset's non-ignored messages it must store to be proposed
# Rejections that mean "an earlier message is needed", not "this is not the format".
WAITING = frozenset({"no_birth", "unknown_alias", "no_datatype"})


@dataclass
class Tally:
    """What one rule made of the captured messages."""

    accepted: int = 0
    rejected: int = 0
    ignored: int = 0
    # Of the rejected: messages a stateful format refused only for want of an earlier
    # message (a Sparkplug DATA whose BIRTH came before the capture): they fit the format.
    waiting: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    example: str = ""
    topics: set[str] = field(default_factory=set)
    sensors: set[str] = field(default_factory=set)  # the sensor ids its readings have
    measurements: set[str] = field(default_factory=set)  # the names they store

    @property
    def messages(self) -> int:
        """Messages the rule took."""
        return self.accepted + self.rejected + self.ignored

    def summary(self) -> str:
        """What the rule took of the capture, in words."""
        took = f"{self.messages} message(s) on {len(self.topics)} topic(s) of the capture"
        if self.ignored == self.messages:
            return f"{took}, ignored"
        rejected = f", {self.rejected} rejected" if self.rejected else ""
        ignored = f", {self.ignored} ignored" if self.ignored else ""
        return f"{took}: {self.accepted} stored{rejected}{ignored}"

    def stores(self) -> str | None:
        """What the rule's readings store: the sensors and measurements, in words."""
        if not self.sensors:
            return None
        sensors = sorted(self.sensors)
        names = sorted(self.measurements)
        more = f", +{len(sensors) - 3} more" if len(sensors) > 3 else ""
        rest = f", +{len(names) - 8} more" if len(names) > 8 else ""
        return (
            f"stores {len(sensors)} sensor(s) ({', '.join(sensors[:3])}{more}); "
            f"measurements {', '.join(names[:8])}{rest}"
        )


async def capture(
    mqtt: MqttSettings,
    topics: Sequence[str],
    seconds: float,
    max_messages: int,
    err: TextIO = sys.stderr,
) -> list[Captured]:
    """Messages received on ``topics`` within ``seconds`` (at most ``max_messages``)."""
    tls = mqtt.ssl_context()
    out: list[Captured] = []
    kept = 0
    async with aiomqtt.Client(
        mqtt.host,
        mqtt.port,
        username=mqtt.username,
        password=mqtt.password,
        tls_context=tls,
        identifier=f"ingest-discover-{uuid.uuid4().hex[:8]}",
    ) as client:
        for topic in topics:
            await client.subscribe(topic, qos=0)
        err.write(
            f"listening to {', '.join(topics)} on {mqtt.host}:{mqtt.port} for "
            f"{seconds:g} s (or {max_messages} messages)\n"
        )
        err.flush()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                async for message in client.messages:
                    payload = message.payload
                    data = payload if isinstance(payload, bytes) else str(payload).encode()
                    out.append(
                        Captured(message.topic.value, data[:MAX_PAYLOAD], bool(message.retain))
                    )
                    kept += min(len(data), MAX_PAYLOAD)
                    if len(out) >= max_messages or kept >= MAX_BYTES:
                        break
    return out


def tally(
    rules: Sequence[Rule], messages: Sequence[Captured], now: float
) -> tuple[dict[str, Tally], list[Captured]]:
    """Each rule's counts over the messages (through the real engine), and the unmatched."""
    mapping = Mapping(list(rules))
    counts = {rule.name: Tally() for rule in rules}
    unmatched: list[Captured] = []
    limits = Limits(max_past_seconds=100 * 365 * 86400.0)  # a capture may replay old data
    for msg in messages:
        result = mapping.decode(msg.topic, msg.payload, now, limits)
        if result.rule is None:
            unmatched.append(msg)
            continue
        count = counts[result.rule.name]
        count.topics.add(msg.topic)
        if result.ignored:
            count.ignored += 1
        elif result.decoded.readings or not result.decoded.rejections:
            count.accepted += 1  # stored, or taken as state (a Homie attribute, a DEATH)
            for reading in result.decoded.readings:
                count.sensors.add(reading.sensor_id)
                count.measurements.update(reading.values)
        else:
            count.rejected += 1
            reasons = {r.reason for r in result.decoded.rejections}
            if reasons and reasons <= WAITING and result.rule.format in mapping.stateful:
                count.waiting += 1
        for rejection in result.decoded.rejections:
            count.reasons[rejection.reason] += 1
            if not count.example:
                count.example = f"{msg.topic}: {rejection.reason}: {rejection.detail}"[:200]
    return counts, unmatched


def sparkplug_types(messages: Sequence[Captured]) -> Counter[str]:
    """Captured Sparkplug B messages by message type (NBIRTH, NDATA, ..., STATE)."""
    return Counter(
        parsed.type for parsed in (spb.topic_of(m.topic) for m in messages) if parsed is not None
    )


def recognise(
    messages: Sequence[Captured], now: float, skip: Sequence[str]
) -> list[tuple[str, Tally]]:
    """Shipped presets that fit the capture: they store messages and reject few."""
    fits = []
    for name in preset_names():
        if name in skip:
            continue
        counts, _ = tally(load_preset(name), messages, now)
        total = Tally(
            sum(c.accepted for c in counts.values()),
            sum(c.rejected for c in counts.values()),
            sum(c.ignored for c in counts.values()),
            sum(c.waiting for c in counts.values()),
        )
        stored = total.accepted + total.rejected
        fitting = total.accepted + total.waiting
        if fitting and fitting >= PRESET_FIT * stored:
            fits.append((name, total))
    return fits


def _names(patterns: list[Pattern], taken: set[str]) -> list[str]:
    """Unique rule names from the patterns' literal levels."""
    out = []
    for pattern in patterns:
        words = [lv for lv in pattern.levels if lv not in {"+", "#"} and not lv.startswith("{")]
        if pattern.filters:  # the housekeeping filters of one first level, listed
            words = [pattern.levels[0], "housekeeping"]
        base = "-".join(words)[:50] or "topics"
        base = "".join(c if c.isalnum() or c in "_-" else "_" for c in base)
        name, n = base, 2
        while name in taken:
            name, n = f"{base}-{n}", n + 1
        taken.add(name)
        out.append(name)
    return out


def proposal_text(
    patterns: list[Pattern],
    names: list[str],
    header: list[str],
    now: float,
    counts: dict[str, Tally] | None = None,
) -> str:
    """The proposed mapping file; ``counts``: what each rule took of the capture."""
    parts = ["\n".join(f"# {line}" if line else "#" for line in header)]
    parts += [
        rule_text(
            p,
            n,
            now,
            counts[n].summary() if counts else None,
            counts[n].stores() if counts else None,
        )
        for p, n in zip(patterns, names, strict=True)
    ]
    return "\n\n".join(parts) + "\n"


def report(counts: dict[str, Tally], sources: dict[str, str], unmatched: int, out: TextIO) -> None:
    """The per-rule table on stderr."""
    width = max([len(n) for n in counts] + [4])
    out.write(f"{'rule':<{width}}  {'from':<22} {'accepted':>8} {'rejected':>8} {'ignored':>8}\n")
    idle = 0
    for name, c in counts.items():
        if not (c.accepted or c.rejected or c.ignored):
            idle += 1
            continue
        out.write(
            f"{name:<{width}}  {sources[name][:22]:<22} {c.accepted:>8} {c.rejected:>8} "
            f"{c.ignored:>8}\n"
        )
    out.write(f"{'(no rule)':<{width}}  {'':<22} {0:>8} {unmatched:>8} {0:>8}\n")
    if idle:
        out.write(f"({idle} other rule(s) matched none of the captured messages)\n")


def advice(
    counts: dict[str, Tally],
    patterns: list[Pattern],
    presets: list[str],
    mine: str | None,
    out: TextIO,
) -> None:
    """What to edit next."""
    tips = []
    flags = "".join(f" --preset {n}" for n in presets)
    if not patterns:
        given = f" --mapping {mine}" if mine else ""
        tips.append(
            f"run with{given}{flags}: the capture needs no rules of its own (this "
            "file has none, and a mapping file needs one)"
        )
    elif mine:
        tips.append(
            f"append this file's rules to {mine}, after your rules (the first "
            f"matching rule wins), then run with --mapping {mine}{flags}"
        )
    else:
        tips.append(
            f"run with{flags} --mapping <this file>"
            + (
                " (this file's rules are tried first: none takes a topic these presets handle)"
                if presets
                else ""
            )
        )
    for name, c in counts.items():
        if c.waiting:
            if c.reasons["no_datatype"]:
                tips.append(
                    f"rule {name}: {c.waiting} Homie value(s) came before their "
                    "property's attributes (no_datatype; retained values arrive "
                    "first when subscribing to #): the daemon subscribes to the "
                    "attributes first (docs/presets.md#homie)"
                )
            else:
                tips.append(
                    f"rule {name}: {c.waiting} message(s) refer to a BIRTH "
                    "published before the capture (no_birth, unknown_alias): the "
                    "daemon stores them once it has the BIRTH (docs/sparkplug.md)"
                )
        if c.rejected > c.waiting:
            reasons = ", ".join(f"{r} x{k}" for r, k in c.reasons.most_common(3))
            tips.append(
                f"rule {name}: {c.rejected} message(s) rejected ({reasons}), e.g. {c.example}"
            )
    notes = sum(len(p.notes) + sum(len(f.notes) for f in p.filters) for p in patterns)
    if notes:
        tips.append(f"{notes} NOTE comment(s) in the file mark guesses to check")
    tips.append("try a message: ingest check --mapping <file> --topic-name TOPIC 'PAYLOAD'")
    out.write("\nnext:\n" + "".join(f"  - {tip}\n" for tip in tips))


async def run(
    mqtt: MqttSettings,
    topics: Sequence[str],
    seconds: float,
    max_messages: int,
    mapping_file: str | None,
    presets: Sequence[str],
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Capture, recognise, propose, check; 0 when the proposal stores what it should."""
    given: list[Rule] = load_file(mapping_file) if mapping_file else []
    for name in presets:
        given.extend(load_preset(name))
    messages = await capture(mqtt, topics, seconds, min(max_messages, MAX_MESSAGES), err)
    err.write(
        f"captured {len(messages)} message(s) on {len({m.topic for m in messages})} "
        f"topic(s) in up to {seconds:g} s "
        f"({sum(m.retained for m in messages)} retained)\n"
    )
    if not messages:
        err.write("nothing to propose: no message arrived (check --topic and the broker)\n")
        return 1
    return finish(messages, given, presets, out, err)


def finish(
    messages: list[Captured],
    given: list[Rule],
    presets: Sequence[str],
    out: TextIO,
    err: TextIO,
    now: float | None = None,
) -> int:
    """Everything after the capture (separate for tests)."""
    now = time.time() if now is None else now
    mine = [r for r in given if not r.source.startswith("--preset ")]
    _, rest = tally(given, messages, now) if given else ({}, messages)
    fits = recognise(rest, now, presets)
    preset_rules = [
        *(r for r in given if r not in mine),
        *(r for name, _ in fits for r in load_preset(name)),
    ]
    before = [*mine, *preset_rules]
    counts, rest = tally(before, messages, now) if before else ({}, messages)
    taken = {t for r in preset_rules for t in counts[r.name].topics}
    known = conventions.read([(m.topic, m.payload) for m in messages])
    patterns = separate(propose(rest, known), preset_rules, taken)
    patterns = merge_tail(
        patterns, taken, [f.split("/") for r in preset_rules for f in r.subscriptions]
    )
    patterns = list_chores(patterns)
    names = _names(patterns, {r.name for r in before})
    text = proposal_text(patterns, names, [], now)
    proposed = parse(text, "proposal") if patterns else []
    rules = [*mine, *proposed, *preset_rules]  # the daemon's order, the proposal appended
    counts, unmatched = tally(rules, messages, now)
    sources = {r.name: r.source.removeprefix("--") for r in rules}
    all_presets = [*presets, *(n for n, _ in fits)]
    out.write(
        proposal_text(
            patterns, names, _header(messages, fits, counts, sources, bool(patterns)), now, counts
        )
    )
    types = sparkplug_types(messages)
    if types:
        err.write(
            "Sparkplug B messages: "
            + ", ".join(f"{kind} {types[kind]}" for kind in spb.MESSAGE_TYPES if types[kind])
            + "\n"
        )
    report(counts, sources, len(unmatched), err)
    stolen = {r.name: len(counts[r.name].topics & taken) for r in proposed}
    for name, n in stolen.items():
        if n:  # separate() prevents it; said loudly if it ever does not
            err.write(f"rule {name} takes {n} topic(s) a preset would take: narrow its topic\n")
    mine_file = next((r.source.removeprefix("--mapping ") for r in mine), None)
    advice(counts, patterns, all_presets, mine_file, err)
    return 0


def _header(
    messages: list[Captured],
    fits: list[tuple[str, Tally]],
    counts: dict[str, Tally],
    sources: dict[str, str],
    proposed: bool,
) -> list[str]:
    lines = [
        (
            f"Proposed by ingest discover from {len(messages)} message(s) on "
            f"{len({m.topic for m in messages})} topic(s)."
        )
    ]
    for name, _ in fits:
        took = [c for n, c in counts.items() if sources[n] == f"preset {name}"]
        accepted = sum(c.accepted for c in took)
        ignored = sum(c.ignored for c in took)
        lines.append(
            f"Preset {name} takes {sum(c.messages for c in took)} message(s) "
            f"({accepted} accepted, {ignored} ignored): use --preset {name} with "
            "this file."
        )
    lines += [
        "This file's rules are tried before the presets' and take none of their topics.",
        "Each rule below is a guess from the topics and payloads seen: check the",
        "NOTE lines, then try it with ingest check and run with --mapping FILE.",
        "",
    ]
    if not proposed:
        lines.append("Every message is taken by the given rules and presets: nothing to add.")
    return lines


def main(args: argparse.Namespace, env: Env[str, str]) -> int:
    """``ingest discover`` from parsed arguments (ConfigError: the CLI's one line, exit 2)."""
    mqtt = parse_mqtt_url(args.mqtt_url)
    password = mqtt.password
    if args.mqtt_password_file:
        password = read_secret(args.mqtt_password_file, "--mqtt-password-file")
    mqtt = replace(mqtt, password=password, ca_file=args.mqtt_ca_file)
    presets = args.preset or [
        p.strip() for p in env.get("INGEST_PRESET", "").split(",") if p.strip()
    ]
    if args.seconds <= 0 or args.max_messages < 1:
        raise ConfigError("--seconds and --max-messages must be positive")
    try:
        return asyncio.run(
            run(mqtt, args.topic or ["#"], args.seconds, args.max_messages, args.mapping, presets)
        )
    except aiomqtt.MqttError as exc:
        sys.stderr.write(f"ingest: error: broker {mqtt.host}:{mqtt.port}: {exc}\n")
        return 1
