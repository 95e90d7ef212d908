"""Pure: what a run publishes, as a function of (seed, sensor index, seq), and in which order.

Nothing here does I/O or reads a clock, so ``verify`` regenerates exactly what
``publish`` sent from the same parameters. Values are rounded to three decimals, so the
double MongoDB stores equals the regenerated one; timestamps are whole milliseconds,
the precision of a BSON date.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Iterator

MEASUREMENTS: tuple[str, ...] = ("hum", "temp")
_NOISE_SIZE = 4096  # a power of two: indexes are masked, not divided
_TAU = 2 * math.pi


@dataclass(frozen=True, slots=True)
class Run:
    """The parameters that determine every reading of a run."""

    seed: int
    sensor_prefix: str
    sensors: int
    per_message: int
    start_ms: int
    step_ms: int
    topic_prefix: str = "sensors"
    # Between the prefix and the index in a sensor id: "/" for a Sparkplug B fleet, whose
    # sensor ids the daemon makes <group>/<edge node>.
    separator: str = "-"
    # Every Nth sensor (index % N == 0) publishes its readings without a time, as most
    # devices do: the daemon times them at arrival. 0: every reading has its time.
    untimed_every: int = 0

    def timed(self, index: int) -> bool:
        """Whether sensor ``index`` puts a time in its readings."""
        return not (self.untimed_every and index % self.untimed_every == 0)

    def sensor_id(self, index: int) -> str:
        """The id of the sensor at ``index``."""
        return f"{self.sensor_prefix}{self.separator}{index}"

    def topic(self, index: int) -> str:
        """The topic sensor ``index`` publishes to."""
        return f"{self.topic_prefix}/{self.sensor_id(index)}/readings"

    def ts_ms(self, seq: int) -> int:
        """Timestamp in epoch milliseconds of any sensor's reading ``seq``."""
        return self.start_ms + seq * self.step_ms

    def seq_of(self, ts_ms: int | None) -> int | None:
        """The seq whose timestamp is ``ts_ms``, or None if it is off the run's grid."""
        if ts_ms is None:
            return None
        seq, off = divmod(ts_ms - self.start_ms, self.step_ms)
        return seq if off == 0 else None


@dataclass(frozen=True, slots=True)
class Shape:
    """One sensor's slow drift: base level, amplitude, period and phase per measurement."""

    index: int
    temp_base: float
    temp_amp: float
    hum_base: float
    hum_amp: float
    period_ms: float
    phase: float


class Model:
    """Values of a run: a slow sinusoidal drift per sensor plus reproducible noise."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - simulated data, not security
        self._noise = [rng.gauss(0.0, 1.0) for _ in range(_NOISE_SIZE)]
        self._seed = seed

    def shape(self, index: int) -> Shape:
        """The drift parameters of sensor ``index`` (depend on seed and index only)."""
        rng = random.Random(f"{self._seed}/{index}")  # noqa: S311
        return Shape(
            index,
            rng.uniform(15.0, 25.0),
            rng.uniform(1.0, 5.0),
            rng.uniform(35.0, 65.0),
            rng.uniform(2.0, 10.0),
            rng.uniform(1800.0, 6 * 3600.0) * 1000.0,
            rng.uniform(0.0, _TAU),
        )

    def values(self, shape: Shape, seq: int, ts_ms: int) -> tuple[float, float]:
        """``(hum, temp)`` of one reading, rounded to three decimals."""
        angle = ts_ms / shape.period_ms * _TAU + shape.phase
        mask = _NOISE_SIZE - 1
        noise = self._noise
        n_temp = noise[(seq * 7919 + shape.index * 104_729) & mask]
        n_hum = noise[(seq * 6151 + shape.index * 15_485_863 + 1) & mask]
        temp = round(shape.temp_base + shape.temp_amp * math.sin(angle) + 0.1 * n_temp, 3)
        hum = round(shape.hum_base + shape.hum_amp * math.cos(angle) + 0.5 * n_hum, 3)
        return hum, temp


def reading(run: Run, model: Model, shape: Shape, seq: int) -> dict[str, Any]:
    """One reading as published: ``{"ts", "seq", "hum", "temp"}``.

    A sensor that sends no time leaves ``ts`` out; its values are still those of its
    ``seq``'s time on the run's grid.
    """
    ts_ms = run.ts_ms(seq)
    hum, temp = model.values(shape, seq, ts_ms)
    if not run.timed(shape.index):
        return {"seq": seq, "hum": hum, "temp": temp}
    return {"ts": ts_ms / 1000, "seq": seq, "hum": hum, "temp": temp}


def message(run: Run, model: Model, shape: Shape, first_seq: int, count: int) -> bytes:
    """A payload of ``count`` readings from ``first_seq``: one object, or an envelope."""
    if count == 1 and run.per_message == 1:
        return orjson.dumps(reading(run, model, shape, first_seq))
    readings = [reading(run, model, shape, seq) for seq in range(first_seq, first_seq + count)]
    return orjson.dumps({"sensor_id": run.sensor_id(shape.index), "readings": readings})


def split_count(total: int, sensors: int) -> list[int]:
    """Readings per sensor when ``total`` readings are spread evenly over ``sensors``."""
    base, extra = divmod(total, sensors)
    return [base + (1 if index < extra else 0) for index in range(sensors)]


def worker_sensors(sensors: int, workers: int, worker: int) -> list[int]:
    """Sensor indexes handled by ``worker`` of ``workers`` (interleaved, so shares are even)."""
    return list(range(worker, sensors, workers))


def message_plan(
    sensors: list[int], limits: list[int] | None, per_message: int
) -> Iterator[tuple[int, int, int]]:
    """Messages as ``(position in sensors, first seq, readings)``, round-robin over sensors.

    With ``limits`` (readings per position) the plan ends when each sensor has sent its
    share; without, it never ends (``--duration`` stops it).
    """
    seq = 0
    while True:
        active = False
        for pos in range(len(sensors)):
            remaining = per_message if limits is None else min(per_message, limits[pos] - seq)
            if remaining > 0:
                active = True
                yield pos, seq, remaining
        if not active:
            return
        seq += per_message


def late_plan(
    plan: Iterator[tuple[int, int, int]], per_message: int, every: int
) -> Iterator[tuple[int, int, int]]:
    """``plan`` with every ``every``-th message of each sensor held back and sent at the end.

    The held-back messages arrive after all others: late and out of order, as from sensors
    that buffered while offline. Only for finite plans (``--count``).
    """
    if every <= 0:
        yield from plan
        return
    held: list[tuple[int, int, int]] = []
    for item in plan:
        if (item[1] // per_message) % every == every - 1:
            held.append(item)
        else:
            yield item
    yield from held
