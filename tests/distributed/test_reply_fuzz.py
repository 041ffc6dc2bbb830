"""One bad client cannot hurt the server: every field of a reply is fuzzed against the
Flower server loop (no Flower processes: the loop and payloads import no Flower).

Every malformed reply must be rejected by :meth:`BufferedServerLoop.handle` - never raise,
count once in ``rejected``, leave the global model bit-identical and reach the strategy's
buffer never - and an honest reply afterwards must still be accepted. The decoders must
reject each case themselves (InvalidUpdateError): the loop's last-resort handler
(``unhandled ...``) counts as a failure here. The client side's instruction decoder is
fuzzed the same way."""

from __future__ import annotations

import math
import random
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import yaml

from conftest import tiny_config
from fedgmr.algorithm.encoding import HEADER_BYTES
from fedgmr.algorithm.params import get_buffers
from fedgmr.errors import InvalidUpdateError
from fedgmr.experiment.build import build_experiment
from fedgmr.flower.client import load_run_config, train_handler, workload_for
from fedgmr.flower.faults import corrupt
from fedgmr.flower.loop import BufferedServerLoop, LoopSettings, _Flight, bound_influence
from fedgmr.flower.payload import decode_instruction, encode_instruction, reply_limit
from fedgmr.strategy.scaffold import ScaffoldControl

SLOTS = (0, 3)  # the full-density client and a 0.05-density one (High heterogeneity, 4 clients)
RANDOM_CASES = 400


@dataclass
class _Arrived:
    instruction_id: str
    node_id: int
    fields: Any
    error: str | None
    nbytes: int


class _NoLink:
    """The fuzz hands replies to ``handle`` directly; nothing is ever pushed."""

    def push(self, node_id: int, fields: Any, ttl: float, group: str) -> str:
        raise AssertionError("the fuzz test never dispatches")

    def pull(self, ids: Any) -> list:
        return []


@dataclass
class World:
    run_config: dict[str, Any]
    honest: dict[int, dict[str, Any]]  # slot -> an honest reply's fields (version 0)


def _run_config(tmp: Path) -> dict[str, Any]:
    raw = tiny_config(model={"name": "cnn", "options": {"channels": [8, 16]}},
                      clients={"num_clients": 4, "heterogeneity": "high"}, run={"max_steps": 4, "eval_every": 2})
    path = tmp / "fedgmr.yaml"
    path.write_text(yaml.safe_dump(raw))
    return {"config": str(path)}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    run_config = _run_config(tmp_path_factory.mktemp("fuzz"))
    loop = _loop(run_config)
    s = loop.strategy
    settings = loop.train
    honest = {}
    for slot in SLOTS:
        a = s.assign(slot)
        fields = encode_instruction(slot, a.version, 7, a.consumes, a.mask, s.params, s.buffers, settings)
        honest[slot] = train_handler(fields, run_config, {"partition-id": slot}, slot)
    assert honest[0]["payload"] != honest[3]["payload"]
    assert any(k.startswith("buf.") for k in honest[0])  # BatchNorm buffers travel
    return World(run_config, honest)


def _loop(run_config: dict[str, Any]) -> BufferedServerLoop:
    cfg = load_run_config(run_config)
    exp = build_experiment(cfg)
    exp.executor.close()
    # the deployment's bounds (samples cap, adaptive update-norm bound)
    bound_influence(exp.strategy, [len(i) for i in exp.partition.clients], {})
    settings = LoopSettings(max_steps=4, k=2, reply_timeout=5.0, step_timeout=2.0)
    return BufferedServerLoop(exp.strategy, _NoLink(), list(range(4)), exp.simulator.evaluator, settings,
                              exp.simulator.executor.workload.settings, cfg.seed)


# ---------------------------------------------------------------------- cases
_NAN32 = struct.pack("<f", float("nan"))
_INF32 = struct.pack("<f", float("inf"))
#: values of every wrong type a field could carry (Flower would carry most of them)
WRONG = [("str", "abc"), ("empty str", ""), ("list", [1.0]), ("empty list", []), ("dict", {"a": 1}),
         ("bytes", b"\x00\x01"), ("None", None), ("True", True), ("False", False), ("nan", float("nan")),
         ("inf", float("inf")), ("-inf", float("-inf")), ("2**63", 2 ** 63), ("2**64", 2 ** 64),
         ("-2**64", -2 ** 64), ("2**4000", 2 ** 4000), ("1.5", 1.5), ("-1", -1), ("0", 0), ("1e300", 1e300),
         ("tuple", (1,)), ("list of lists", [[1]])]


def _valid(field: str, v: Any, slot: int) -> bool:
    """Whether ``v`` is a well-formed value for ``field`` (such values are not malformed)."""
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if field == "client":
        return number and isinstance(v, int) and v == slot
    if field == "version":
        return number and isinstance(v, int) and v == 0
    if field in ("num_samples", "num_processed"):
        return number and isinstance(v, int) and 1 <= v < 2 ** 63
    if field == "loss":
        try:
            return number and math.isfinite(float(v))
        except OverflowError:
            return False
    if field == "val_score":
        return number and 0 <= v <= 1
    if field == "compute_s":  # the training time the client reports (optional)
        try:
            return number and math.isfinite(float(v)) and 0 <= v <= 1e6
        except OverflowError:
            return False
    return False


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def malformed_cases(fields: dict[str, Any], slot: int, n: int) -> list[tuple[str, Any]]:
    """(name, fields) of every deterministic malformed variant of an honest reply."""
    cases: list[tuple[str, Any]] = []

    def variant(name: str, change: Callable[[dict[str, Any]], None]) -> None:
        f = dict(fields)
        change(f)
        cases.append((name, f))

    keys = list(fields) + ["num_processed", "val_score", "compute_s"]
    for key in dict.fromkeys(keys):
        for label, v in WRONG:
            if not _valid(key, v, slot):
                variant(f"{key}={label}", lambda f, key=key, v=v: f.__setitem__(key, v))
    for key in fields:
        if key not in ("num_processed", "val_score", "compute_s"):
            variant(f"missing {key}", lambda f, key=key: f.pop(key))
    for extra, v in (("extra", 1), ("buf.nope", b""), ("buf.nope.dtype", "float32"), ("Payload", b""),
                     ("train.lr", 0.1), ("", 0), ("payload.extra", b"x")):
        variant(f"extra field {extra!r}", lambda f, extra=extra, v=v: f.__setitem__(extra, v))
    variant("a non-string key", lambda f: f.__setitem__(5, 1))
    variant("client = another known client", lambda f: f.__setitem__("client", (slot + 1) % 4))
    variant("future version", lambda f: f.__setitem__("version", 10 ** 6))
    variant("stale version", lambda f: f.__setitem__("version", -1))
    cases += [(f"whole message is {label}", v) for label, v in (("None", None), ("list", []), ("str", "x"),
                                                                ("bytes", b"payload"), ("int", 3))]
    # payload bytes
    p = fields["payload"]
    for label, data in (("truncated by 1", p[:-1]), ("truncated to half", p[: len(p) // 2]),
                        ("header only", p[:HEADER_BYTES]), ("short header", p[: HEADER_BYTES - 1]),
                        ("empty", b""), ("extended by 1", p + b"\x00"), ("extended by a value", p + b"\x00" * 4),
                        ("oversized", p + bytes(reply_limit(n) + 1)),
                        ("first value NaN", p[:HEADER_BYTES] + _NAN32 + p[HEADER_BYTES + 4:]),
                        ("last value +Inf", p[:-4] + _INF32), ("last value -Inf", p[:-4] + b"\x00\x00\x80\xff"),
                        ("model one coordinate larger", corrupt(fields, "shape")["payload"]),
                        ("values outside the mask", corrupt(fields, "outside-mask")["payload"])):
        variant(f"payload {label}", lambda f, data=data: f.__setitem__("payload", data))
    for bit in range(HEADER_BYTES * 8):
        variant(f"payload header bit {bit} flipped", lambda f, bit=bit: f.__setitem__("payload", _flip(p, bit)))
    # buffers: bytes, dtype, shape
    for name in sorted(k[4:] for k in fields if k.startswith("buf.") and not k.endswith((".dtype", ".shape"))):
        key, raw, dtype = f"buf.{name}", fields[f"buf.{name}"], fields[f"buf.{name}.dtype"]
        for label, data in (("truncated", raw[:-1]), ("extended", raw + b"\x00"), ("empty", b""),
                            ("doubled", raw + raw)):
            variant(f"{key} bytes {label}", lambda f, key=key, data=data: f.__setitem__(key, data))
        if dtype == "float32":
            variant(f"{key} holds NaN", lambda f, key=key, raw=raw: f.__setitem__(key, _NAN32 + raw[4:]))
            variant(f"{key} holds Inf", lambda f, key=key, raw=raw: f.__setitem__(key, _INF32 + raw[4:]))
        if name.endswith("running_var"):
            negative = struct.pack("<f", -1.0) + raw[4:]
            variant(f"{key} negative", lambda f, key=key, data=negative: f.__setitem__(key, data))
        if dtype == "int64":
            variant(f"{key} negative", lambda f, key=key: f.__setitem__(key, struct.pack("<q", -5)))
        for label, v in (("float64", "float64"), ("int8", "int8"), ("torch-prefixed", f"torch.{dtype}"),
                         ("wrong known dtype", "int64" if dtype != "int64" else "float32"),
                         ("as a list", [dtype]), ("int", 5), ("None", None), ("bytes", dtype.encode())):
            variant(f"{key}.dtype {label}", lambda f, key=key, v=v: f.__setitem__(f"{key}.dtype", v))
        shape = fields[f"{key}.shape"]
        for label, v in (("empty", []), ("scalar", [-1]) if shape != [-1] else ("1-d", [1]),
                         ("huge", [2 ** 40]), ("negative", [-4]), ("bools", [True] * len(shape)),
                         ("strings", [str(d) for d in shape]), ("a string", str(shape)), ("None", None),
                         ("nested", [shape]), ("extra dim", shape + [1]), ("2**64", [2 ** 64])):
            variant(f"{key}.shape {label}", lambda f, key=key, v=v: f.__setitem__(f"{key}.shape", v))
    return cases


# ---------------------------------------------------------------------- checks
def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


def _snapshot(loop: BufferedServerLoop) -> tuple:
    s = loop.strategy
    return (_bits(s.params), {k: _bits(v) for k, v in s.buffers.items()}, s.rejected, s.arrivals,
            {c: id(e) for c, e in s._buffer.items()}, s.version)


def _offer(loop: BufferedServerLoop, slot: int, fields: Any) -> bool:
    """Hand ``fields`` to the loop as the reply to a fresh job of ``slot``."""
    a = loop.strategy.assign(slot)
    msg_id = uuid.uuid4().hex
    loop.in_flight[msg_id] = _Flight(slot, a.version, 0.0, 0, a.reply_mask, a.density, tuple(a.wire.reply_beside),
                                     int(a.wire.reply_plain))
    return loop.handle(_Arrived(msg_id, slot, fields, None, 0))


def _check_rejected(loop: BufferedServerLoop, slot: int, name: str, fields: Any) -> str | None:
    """None when ``fields`` was rejected cleanly, else what went wrong."""
    before = _snapshot(loop)
    lines = len(loop.stats.log)
    try:
        accepted = _offer(loop, slot, fields)
    except Exception as exc:  # noqa: BLE001 - the failure this test exists to catch
        return f"{name}: handle raised {type(exc).__name__}: {exc}"
    if accepted:
        return f"{name}: accepted"
    after = _snapshot(loop)
    if after[2] != before[2] + 1:
        return f"{name}: rejected counted {after[2] - before[2]} times"
    if after[:2] != before[:2] or after[3:] != before[3:]:
        return f"{name}: the model, buffer or arrivals changed"
    if any(": unhandled " in line for line in loop.stats.log[lines:]):
        return f"{name}: only the last-resort handler caught it ({loop.stats.log[-1]})"
    return None


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("slot", SLOTS)
def test_every_malformed_field_is_rejected_cleanly_and_an_honest_reply_still_counts(world, slot, capsys):
    loop = _loop(world.run_config)
    cases = malformed_cases(world.honest[slot], slot, loop.strategy.space.numel)
    failures = [f for name, fields in cases if (f := _check_rejected(loop, slot, name, fields)) is not None]
    assert not failures, "\n".join(failures)
    assert loop.strategy.rejected == len(cases)
    assert loop.strategy.arrivals == [] and not loop.strategy._buffer
    # the honest reply is still accepted, and the model it makes is the one without the fuzz
    assert _offer(loop, slot, world.honest[slot]) is True
    loop.strategy.aggregate()
    ref = _loop(world.run_config)
    assert _offer(ref, slot, world.honest[slot]) is True
    ref.strategy.aggregate()
    assert _bits(loop.strategy.params) == _bits(ref.strategy.params)
    assert {k: _bits(v) for k, v in loop.strategy.buffers.items()} == \
        {k: _bits(v) for k, v in ref.strategy.buffers.items()}
    with capsys.disabled():
        print(f"\nslot {slot}: {len(cases)} malformed replies tried, {len(cases)} rejected cleanly, 0 failed")


def test_well_formed_variants_are_accepted(world):
    """The fuzz is not passing by rejecting everything: valid edge values are accepted,
    and an absurd sample count is capped rather than trusted."""
    loop = _loop(world.run_config)
    s = loop.strategy
    f = world.honest[3]
    variants = [dict(f, loss=0), dict(f, loss=1e300), dict(f, val_score=0.0), dict(f, val_score=1),
                dict(f, num_processed=7), {k: v for k, v in f.items() if not k.startswith("buf.")},
                dict(f, num_samples=2 ** 62)]
    for v in variants:
        assert _offer(loop, 3, v) is True
    assert s.rejected == 0
    assert s._buffer[3].num_samples == s.influence.max_samples  # 2**62 claimed, capped at the largest partition
    assert s.influence.max_samples < 2 ** 20 and s.bounds.capped == 1


def test_random_byte_and_field_fuzz_never_escapes_the_loop(world, capsys):
    """Seeded random mutations: bit flips, splices and truncations of the payload and
    buffer bytes, and random values in random fields. A mutation may happen to be well
    formed (a flipped mantissa bit is another finite value); then it must be accepted
    within the norm bound. Everything else must be rejected cleanly."""
    rng = random.Random(20260501)
    loop = _loop(world.run_config)
    s = loop.strategy
    tried = rejected = accepted = 0
    failures: list[str] = []
    byte_keys = {slot: [k for k, v in world.honest[slot].items() if isinstance(v, bytes)] for slot in SLOTS}
    for i in range(RANDOM_CASES):
        slot = SLOTS[i % len(SLOTS)]
        f = dict(world.honest[slot])
        how = rng.randrange(4)
        if how == 0:  # flip 1..8 random bits of a random bytes field
            key = rng.choice(byte_keys[slot])
            data = f[key]
            for _ in range(rng.randint(1, 8)):
                data = _flip(data, rng.randrange(len(data) * 8)) if data else data
            f[key] = data
            name = f"{key}: bit flips"
        elif how == 1:  # truncate or extend a random bytes field at a random point
            key = rng.choice(byte_keys[slot])
            cut = rng.randrange(len(f[key]) + 1)
            f[key] = f[key][:cut] + (rng.randbytes(rng.randrange(9)) if rng.random() < 0.5 else b"")
            name = f"{key}: cut at {cut}"
        elif how == 2:  # overwrite a random run of bytes with random bytes
            key = rng.choice(byte_keys[slot])
            data = bytearray(f[key])
            at = rng.randrange(len(data))
            run = rng.randbytes(rng.randint(1, 16))
            data[at:at + len(run)] = run
            f[key] = bytes(data)
            name = f"{key}: spliced at {at}"
        else:  # a random field gets a random value of a random type
            key = rng.choice(list(f) + ["num_processed", "val_score", "junk"])
            label, v = rng.choice(WRONG + [("random bytes", rng.randbytes(rng.randrange(64))),
                                           ("random int", rng.randrange(-2 ** 70, 2 ** 70)),
                                           ("random float", rng.uniform(-1e6, 1e6))])
            f[key] = v
            name = f"{key}={label}"
        tried += 1
        before = _snapshot(loop)
        lines = len(loop.stats.log)
        clipped = s.bounds.clipped
        try:
            ok = _offer(loop, slot, f)
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{name}: handle raised {type(exc).__name__}: {exc}")
            continue
        if any(": unhandled " in line for line in loop.stats.log[lines:]):
            failures.append(f"{name}: only the last-resort handler caught it")
        after = _snapshot(loop)
        if ok:
            accepted += 1
            entry = s._buffer[slot]
            if not bool(torch.isfinite(entry.values).all()) or after[2] != before[2]:
                failures.append(f"{name}: accepted but not sound")
            if entry.num_samples > s.influence.max_samples:
                failures.append(f"{name}: accepted {entry.num_samples} samples above the cap")
            assert s.bounds.clipped in (clipped, clipped + 1)
        else:
            rejected += 1
            if after[2] != before[2] + 1 or after[:2] != before[:2] or after[4] != before[4]:
                failures.append(f"{name}: rejected but the state changed")
    assert not failures, "\n".join(failures[:20])
    assert rejected > RANDOM_CASES // 2  # the fuzz reaches the rejections, not only valid variants
    for slot in SLOTS:
        assert _offer(loop, slot, world.honest[slot]) is True
    with capsys.disabled():
        print(f"\nrandom fuzz: {tried} tried, {rejected} rejected cleanly, {accepted} well-formed and accepted, "
              f"{len(failures)} failed")


def test_instruction_fuzz_on_the_client_raises_only_invalid_update_error(world):
    """The ClientApp decodes every instruction against its own model: any mutation either
    decodes or raises InvalidUpdateError (which Flower turns into an error reply)."""
    cfg = load_run_config(world.run_config)
    workload = workload_for(cfg)
    loop = _loop(world.run_config)
    s = loop.strategy
    a = s.assign(3)
    good = encode_instruction(3, a.version, 7, a.consumes, a.mask, s.params, s.buffers, loop.train)
    numel, bufs = workload.space.numel, get_buffers(workload.model)
    decode_instruction(good, workload.settings, numel, bufs)
    rng = random.Random(7)
    cases: list[tuple[str, Any]] = []
    for key in list(good) + ["junk"]:
        for label, v in WRONG:
            cases.append((f"{key}={label}", dict(good, **{key: v})))
    for i in range(300):
        f = dict(good)
        data = bytearray(f["model"])
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        f["model"] = bytes(data[: rng.randrange(len(data) + 1)]) if i % 3 == 0 else bytes(data)
        cases.append((f"model fuzz {i}", f))
    unexpected = []
    rejected = 0
    for name, f in cases:
        try:
            decode_instruction(f, workload.settings, numel, bufs)
        except InvalidUpdateError:
            rejected += 1
        except Exception as exc:  # noqa: BLE001
            unexpected.append(f"{name}: {type(exc).__name__}: {exc}")
    assert not unexpected, "\n".join(unexpected[:20])
    assert rejected > len(cases) // 2


def test_the_probes_failures_are_rejected(world):
    """The exact replies that crashed the ServerApp at step 0, and the capture by a huge
    sample count."""
    loop = _loop(world.run_config)
    f = world.honest[3]
    dtype_key = next(k for k in f if k.endswith(".dtype"))
    for bad in (dict(f, loss="abc"), dict(f, loss=[1.0]), dict(f, val_score="x"), dict(f, **{dtype_key: ["float32"]})):
        assert _offer(loop, 3, bad) is False
    assert loop.strategy.rejected == 4
    assert not any(": unhandled " in line for line in loop.stats.log)


def test_an_unexpected_decoder_error_is_still_only_a_rejection(world, monkeypatch, caplog):
    """The last-resort handler: whatever the decoder raises, handle() does not."""
    import fedgmr.flower.loop as loop_mod

    loop = _loop(world.run_config)

    def broken(*a: Any, **k: Any) -> Any:
        raise KeyError("a decoder bug")

    monkeypatch.setattr(loop_mod, "decode_reply", broken)
    with caplog.at_level("DEBUG", logger="fedgmr.flower.loop"):
        assert _offer(loop, 3, world.honest[3]) is False
    assert loop.strategy.rejected == 1
    assert "unhandled KeyError" in loop.stats.log[-1]
    assert any(r.exc_info for r in caplog.records if r.levelname == "DEBUG")


# ---------------------------------------------------------------------- values beside the model
def _scaffold(tmp: Path) -> tuple[BufferedServerLoop, dict[str, Any], dict[str, Any]]:
    """A SCAFFOLD loop under the deployment's bounds, and an honest reply of client 1 (with delta_c)."""
    raw = tiny_config(method="scaffold", clients={"num_clients": 4}, run={"max_steps": 4, "eval_every": 2})
    path = tmp / "scaffold.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_config = {"config": str(path)}
    cfg = load_run_config(run_config)
    exp = build_experiment(cfg)
    exp.executor.close()
    bound_influence(exp.strategy, [len(i) for i in exp.partition.clients], {})
    loop = BufferedServerLoop(exp.strategy, _NoLink(), list(range(4)), exp.simulator.evaluator,
                              LoopSettings(max_steps=4, mode="sync"), exp.simulator.executor.workload.settings,
                              cfg.seed, client_extras=("delta_c",))
    s = loop.strategy
    a = s.assign(1)
    fields = encode_instruction(1, a.version, 7, a.consumes, a.mask, s.params, s.buffers, loop.train,
                                extras=a.wire.beside)
    return loop, run_config, train_handler(fields, run_config, {"partition-id": 1}, 1, {})


def test_every_malformed_extra_is_rejected_cleanly_and_never_moves_c(tmp_path, capsys):
    loop, run_config, honest = _scaffold(tmp_path)
    dc = honest["extra.delta_c"]
    assert len(dc) == 4 * loop.strategy.space.numel  # one float32 per value
    cases: list[tuple[str, Any]] = []
    for label, v in WRONG:
        cases.append((f"extra.delta_c={label}", dict(honest, **{"extra.delta_c": v})))
    for label, data in (("truncated by 1", dc[:-1]), ("one value short", dc[:-4]), ("one value more", dc + bytes(4)),
                        ("empty", b""), ("doubled", dc + dc), ("first value NaN", _NAN32 + dc[4:]),
                        ("last value +Inf", dc[:-4] + _INF32), ("last value -Inf", dc[:-4] + b"\x00\x00\x80\xff")):
        cases.append((f"extra.delta_c {label}", dict(honest, **{"extra.delta_c": data})))
    cases.append(("extra.delta_c missing", {k: v for k, v in honest.items() if k != "extra.delta_c"}))
    for name, v in (("extra.tau", struct.pack("<f", 3.0)), ("extra.", b""), ("extra.c", dc), ("extra.delta_c.x", dc)):
        cases.append((f"unexpected {name!r}", dict(honest, **{name: v})))
    c_before = _bits(loop.strategy.plugin(ScaffoldControl).c)
    failures = [f for name, fields in cases if (f := _check_rejected(loop, 1, name, fields)) is not None]
    assert not failures, "\n".join(failures)
    assert loop.strategy.rejected == len(cases) and loop.strategy.arrivals == []
    assert _offer(loop, 1, honest) is True  # the honest reply still counts, and moves c once aggregated
    loop.strategy.aggregate()
    c = loop.strategy.plugin(ScaffoldControl).c
    assert _bits(c) != c_before and bool(torch.isfinite(c).all())
    with capsys.disabled():
        print(f"\nSCAFFOLD delta_c: {len(cases)} malformed replies tried, {len(cases)} rejected cleanly, 0 failed")
