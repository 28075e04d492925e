"""Forged, tampered and replayed bundles against a receiving overlay core.

`c2dtn perf forgery` ("group members can forge each other", "replay"; the
"forged accepted" column of its campaign table).  fmn-4nations' group: deu, nor, prt and
usa share the group key "fmn" and a pair key for every two of them.  deu sends genuine
traffic (group envelopes to fmn and direct ones to prt) through its own overlay core;
prt, a real overlay core on a SQLite store, takes every genuine bundle first.  Then
--attempts bundles of each class below reach prt, built by an adversary that is nor (a
member: the group key and nor's pair keys) or an outsider who captured the traffic:

  spoof-untagged    nor seals a group envelope with deu as its origin, no origin tags
  spoof-tagged      the same, with origin tags made under the keys nor has
  splice            a genuine deu group bundle, its origin tags kept, nor's seal in it (deu named as
                    the origin of nor's envelope)
  splice-added      a genuine deu group bundle, its origin tags kept, its envelopes opened by nor
                    (a member) and sealed again under the group key with nor's envelope added
  splice-added-ack  the same with a "done" ack in deu's name for a report prt holds for the group
  mutate            a genuine deu group bundle under 1-3 mutations (MUTATIONS): its envelopes
                    sealed again by nor, reordered, duplicated, dropped, added or replaced; its
                    seal cut, extended, wrapped in a byte string or nested in an array; its
                    origin tags reordered, duplicated or dropped
  as-group          nor speaks as the group itself: sender and origin "fmn", sealed with the
                    group key as if it were a pair key (an order, or a "done" ack for prt's report)
  spoof-pair        nor seals a direct envelope to prt naming deu, under the nor-prt key
  restamp           a captured genuine bundle with its base second moved (every creation time and
                    expiry with it) or its incarnation changed (every message id), as a relay could
  tamper            a captured genuine bundle with 1-4 random bytes changed
  replay            a captured genuine bundle sent again at once
  replay-late       a captured genuine bundle sent again 11 min after its envelopes ended,
                    past the 10 min their ids are remembered: dropped as expired by the
                    receiver's clock (and as a duplicate when the same bundle comes again
                    within 10 min: the expired id is remembered)
  outsider          an envelope sealed under a key no one shares, deu's name on it
  control           a compromised deu box (deu's own keys) sends new envelopes: these
                    must be taken, or the campaign could not see an acceptance

Per class: bundles, envelopes in them, refused (typed reason), taken as duplicates, taken
as new data ("accepted": a forgery or replay that got through), crashes (an exception
that is not a typed refusal).  Virtual time, no I/O but the receiver's store.  Writes
results/<time>-forgery/ with report.md, summary.json and plot.png (+ .json).
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
from collections import Counter
from pathlib import Path

import cbor2

from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import progress, run_dir, tally_logs

NATIONS = ("deu", "nor", "prt", "usa")
GROUP = "fmn"
GROUP_KEY = hashlib.sha256(b"c2-forgery group").digest()
LIFETIME_MS = 60_000
CLASSES = (
    "spoof-untagged",
    "spoof-tagged",
    "splice",
    "splice-added",
    "splice-added-ack",
    "mutate",
    "as-group",
    "spoof-pair",
    "restamp",
    "tamper",
    "replay",
    "replay-late",
    "outsider",
    "control",
)
MUTATIONS = ("reorder", "duplicate", "drop", "add", "replace", "cut", "extend", "wrap", "nest", "tags")
RESEALED = ("reorder", "duplicate", "drop", "add", "replace")  # nor opens the envelopes and seals them again


def _changed(rng: random.Random, how: str, maps: list[bytes], fresh: bytes) -> list[bytes]:
    """A genuine bundle's maps, changed as `how` says (RESEALED)."""
    maps = list(maps)
    i = rng.randrange(len(maps)) if maps else 0
    if how == "reorder":
        rng.shuffle(maps)
    elif how == "duplicate" and maps:
        maps.insert(rng.randrange(len(maps) + 1), maps[i])
    elif how == "drop" and len(maps) > 1:
        del maps[i]
    elif how == "add":
        maps.insert(rng.randrange(len(maps) + 1), fresh)
    elif how == "replace" and maps:
        maps[i] = fresh
    return maps


def pair_key(a: str, b: str) -> bytes:
    return hashlib.sha256(("c2-forgery " + "-".join(sorted((a, b)))).encode()).digest()


def codec(name: str, as_name: str | None = None):
    """`name`'s codec (its keys); with as_name, those keys under another node's name (a member
    speaking for another)."""
    from c2dtn.overlay.envelope import Codec

    me = as_name or name
    keys = {n: pair_key(name, n) for n in NATIONS if n not in (name, me)}
    if me != name:
        keys[name] = pair_key(me, name)  # the key name shares with me: name has it too
    return Codec(me, keys | {GROUP: GROUP_KEY}, {GROUP: tuple(n for n in NATIONS if n != me)})


def _core(path: Path, name: str):
    from c2dtn.overlay.core import OverlayCore
    from c2dtn.overlay.custody import CustodyStore

    c = codec(name)
    return OverlayCore(CustodyStore(path / f"{name}.db", name, groups=c.groups), c)


class Campaign:
    def __init__(self, work: Path, attempts: int, seed: int):
        from c2dtn.overlay.envelope import Envelope, Kind, Priority

        self.Envelope, self.Kind, self.Priority = Envelope, Kind, Priority
        self.rng = random.Random(seed)
        self.attempts = attempts
        self.deu = _core(work, "deu")
        self.prt = _core(work, "prt")
        self.now = 1_000
        self.captured: list[bytes] = []  # genuine bundles deu sent to prt or the group
        self._groups: list[bytes] | None = None  # those of them for the group
        self._seals: dict | None = None  # the seals of the captured bundles, and their bundles
        self.seq = 1 << 40  # the forgers' seqs: never ones deu used, so dedupe cannot be what refuses them
        self.rows: dict[str, Counter] = {c: Counter() for c in CLASSES}
        self.reasons: dict[str, Counter] = {c: Counter() for c in CLASSES}

    # -- genuine traffic -------------------------------------------------------------
    def genuine(self, n: int) -> int:
        """deu sends n group and n direct envelopes; prt takes every bundle (the group's fan
        out reaches it); returns what prt delivered."""
        got = 0
        for k in range(n + 200):
            if k < n:  # one of each per round: many bundles to capture
                self.deu.submit(GROUP, b"deu position %d" % k, self.now, LIFETIME_MS)
                self.deu.submit("prt", b"deu order %d" % k, self.now, LIFETIME_MS)
            out = self.deu.poll(self.now)
            for b in out:
                if b.dst in (GROUP, "prt") and b.seqs:
                    self.captured.append(b.payload)
                self.prt.on_bundle(b.payload, self.now + 100)
            for b in self.prt.poll(self.now + 100):
                if b.dst == "deu":
                    self.deu.on_bundle(b.payload, self.now + 200)
            items = self.prt.take()
            got += len(items)
            if items:
                self.prt.consumed([d.id for d in items])
            self.now += 250
            if k >= n and got >= 2 * n and not out:
                break
        return got

    # -- what an adversary builds ------------------------------------------------------
    def _env(self, dst: str, body: bytes, origin: str = "deu", **kw):
        self.seq += 1
        return self.Envelope(
            self.Kind.DATA, origin, self.seq, dst, self.now, LIFETIME_MS, body=body, inc=self.deu.store.inc, **kw
        )

    def _stamp(self) -> tuple[int, int]:
        """The stamp deu's scheduler would give a bundle now (forgeries carry a plausible one)."""
        return (self.now // 1000, self.deu.store.inc)

    def build(self, cls: str) -> bytes:
        from c2dtn.overlay.envelope import SEAL_AT, Codec

        lie = b"deu: fall back to phase line red %d" % self.seq
        st = self._stamp()
        if cls == "spoof-untagged":
            bundle = codec("nor", "deu").bundle([self._env(GROUP, lie)], GROUP, st)
            return cbor2.dumps(cbor2.loads(bundle)[: SEAL_AT + 1])
        if cls == "spoof-tagged":
            return codec("nor", "deu").bundle([self._env(GROUP, lie)], GROUP, st)
        if cls == "splice":  # nor's seal with the genuine bundle's own stamp
            spliced = cbor2.loads(self.rng.choice(self._group_bundles()))
            st = (spliced[3], spliced[4])
            spliced[SEAL_AT] = cbor2.loads(codec("nor", "deu").bundle([self._env(GROUP, lie)], GROUP, st))[SEAL_AT]
            return cbor2.dumps(spliced)
        if cls in ("splice-added", "splice-added-ack"):
            spliced = cbor2.loads(self.rng.choice(self._group_bundles()))
            forged = (
                self._ack(self.prt_report)
                if cls.endswith("ack")
                else self._env(GROUP, lie, priority=self.Priority.FLASH)
            )
            return cbor2.dumps(self._resealed(spliced, lambda maps, fresh: maps + [fresh], forged))
        if cls == "mutate":
            return cbor2.dumps(self._mutate(cbor2.loads(self.rng.choice(self._group_bundles())), lie))
        if cls == "as-group":
            as_group = Codec(GROUP, {"prt": GROUP_KEY})
            self.seq += 1
            env = (
                self.Envelope(
                    self.Kind.DATA, GROUP, self.seq, "prt", self.now, LIFETIME_MS, self.Priority.FLASH, body=lie
                )
                if self.rng.random() < 0.5
                else self.Envelope(
                    self.Kind.ACK,
                    GROUP,
                    self.seq,
                    "prt",
                    self.now,
                    LIFETIME_MS,
                    self.Priority.FLASH,
                    body=self._ack(self.prt_report).body,
                )
            )
            return as_group.bundle([env], "prt", st)
        if cls == "spoof-pair":
            as_deu = Codec("deu", {"prt": pair_key("nor", "prt")})
            return as_deu.bundle([self._env("prt", lie)], "prt", st)
        if cls == "outsider":
            stranger = Codec(
                "deu", {n: self.rng.randbytes(32) for n in ("nor", "prt", "usa", GROUP)}, {GROUP: ("nor", "prt", "usa")}
            )
            dst = self.rng.choice(["prt", GROUP])
            return stranger.bundle([self._env(dst, lie)], dst, st)
        if cls == "restamp":
            obj = cbor2.loads(self.rng.choice(self.captured))
            if self.rng.random() < 0.5:
                obj[3] = max(0, obj[3] + self.rng.choice([-1, 1, 700, 3600]))
            else:
                obj[4] = self.rng.choice([v for v in (0, obj[4] ^ 1, (obj[4] + 1) % (1 << 32)) if v != obj[4]])
            return cbor2.dumps(obj)
        if cls == "tamper":
            b = bytearray(self.rng.choice(self.captured))
            for _ in range(self.rng.randint(1, 4)):
                i = self.rng.randrange(len(b))
                b[i] ^= self.rng.randint(1, 255)
            return bytes(b)
        if cls in ("replay", "replay-late"):
            return self.rng.choice(self.captured)
        if cls == "control":
            deu = codec("deu")
            dst = self.rng.choice(["prt", GROUP])
            return deu.bundle([self._env(dst, b"deu (compromised) %d" % self.seq)], dst, st)
        raise ValueError(f"unknown class {cls!r}: " + ", ".join(CLASSES))

    def _group_bundles(self) -> list[bytes]:
        """The captured bundles for the group (with origin tags after the seal), found once."""
        from c2dtn.overlay.envelope import SEAL_AT

        if self._groups is None:
            self._groups = [p for p in self.captured if len(cbor2.loads(p)) == SEAL_AT + 2]
        return self._groups

    def _ack(self, seq: int):
        """A "done" ack in deu's name for prt's report `seq` (which deu never got)."""
        from c2dtn.overlay.envelope import encode_ack_body

        self.seq += 1
        return self.Envelope(
            self.Kind.ACK,
            "deu",
            self.seq,
            GROUP,
            self.now,
            LIFETIME_MS,
            self.Priority.FLASH,
            body=encode_ack_body({self.prt.store.source: ([seq], [])}),
            inc=self.deu.store.inc,
        )

    def _resealed(self, obj: list, change, fresh) -> list:
        """A genuine group container whose envelopes nor (a member) opened, changed with
        change(maps, fresh map) and sealed again under the group key with the container's
        stamp, in deu's name; deu's origin tags kept."""
        from c2dtn.overlay.envelope import SEAL_AT

        nor, forger, st = codec("nor"), codec("nor", "deu"), (obj[3], obj[4])
        c = nor.open_container(cbor2.dumps(obj))
        maps = nor.open_items(c)
        sealed = cbor2.loads(forger.container(change(maps, forger.map_bytes(fresh, stamp=st)), GROUP, st))
        obj[SEAL_AT] = sealed[SEAL_AT]
        return obj

    def _mutate(self, obj: list, lie: bytes) -> list:
        """1-3 mutations of a genuine group container (MUTATIONS): what nor adds is sealed by nor
        with the group key, deu's name as its origin and the container's stamp."""
        from c2dtn.overlay.envelope import SEAL_AT

        rng = self.rng
        genuine = cbor2.dumps(obj)
        hows = rng.sample(MUTATIONS, rng.randint(1, 3))
        for m in hows:
            fresh = rng.choice([self._env(GROUP, lie), self._ack(self.prt_report)])
            seal = obj[SEAL_AT]
            if m in RESEALED and isinstance(seal, bytes):
                try:
                    obj = self._resealed(obj, lambda maps, f, m=m: _changed(rng, m, maps, f), fresh)
                except Exception:  # an earlier mutation left nothing nor can open: leave it
                    pass
            elif m == "cut" and isinstance(seal, bytes):
                obj[SEAL_AT] = seal[: rng.randrange(len(seal))]
            elif m == "extend" and isinstance(seal, bytes):
                obj[SEAL_AT] = seal + rng.randbytes(rng.randint(1, 40))
            elif m == "wrap":
                obj[SEAL_AT] = cbor2.dumps(seal)
            elif m == "nest":
                obj[SEAL_AT] = [seal]
            elif m == "tags" and obj[SEAL_AT + 1]:
                t = obj[SEAL_AT + 1]
                obj[SEAL_AT + 1] = rng.choice([t[::-1], t + t[:1], t[1:]])
        if cbor2.dumps(obj) == genuine:  # (one envelope reordered, or dropped: sealed again, the same bytes)
            obj[SEAL_AT] = obj[SEAL_AT] + rng.randbytes(rng.randint(1, 40))
        return obj

    def _genuine_acks(self, payload: bytes) -> int:
        """Ack envelopes of deu's own in a bundle whose seal is one deu made (spliced bundles
        start from one): those are genuine, whatever else was done to the bundle."""
        from c2dtn.overlay.envelope import SEAL_AT, EnvelopeError, Kind

        if self._seals is None:
            self._seals = {cbor2.loads(p)[SEAL_AT]: p for p in self.captured}
        try:
            genuine = self._seals.get(cbor2.loads(payload)[SEAL_AT])
            if genuine is None:
                return 0
            return sum(e.kind == Kind.ACK for e in codec("prt").open_bundle(genuine))
        except (EnvelopeError, Exception):
            return 0

    def attack(self, cls: str, at_ms: int) -> None:
        from c2dtn.overlay.envelope import EnvelopeError

        row, why = self.rows[cls], self.reasons[cls]
        payload = self.build(cls)
        row["bundles"] += 1
        try:
            res = self.prt.on_bundle(payload, at_ms)
        except EnvelopeError as e:  # typed refusal raised rather than counted
            row["refused"] += 1
            why[e.reason] += 1
            return
        except Exception as e:  # not a typed refusal: a crash of the receive path
            row["crashes"] += 1
            why[f"crash: {type(e).__name__}"] += 1
            return
        row["accepted"] += res.taken
        if cls in ("splice-added-ack", "mutate", "as-group"):  # an ack taken in another's name is a forgery taken
            row["accepted"] += max(0, res.acks - self._genuine_acks(payload))
        row["duplicates"] += res.duplicates
        row["expired_or_stale"] += res.data - res.taken - res.duplicates
        row["refused"] += len(res.rejected)
        for r in res.rejected:
            why[_reason(r)] += 1
        items = self.prt.take()
        row["delivered"] += len(items)
        if items:
            self.prt.consumed([d.id for d in items])

    def run(self, bar=None) -> dict:
        got = self.genuine(max(20, self.attempts // 20))
        # a report prt holds for the group, which no member has acked: what a forged ack would release
        self.prt_report = self.prt.submit(GROUP, b"prt position", self.now, LIFETIME_MS * 100)
        self.prt.poll(self.now)
        task = bar.add_task("forgery: attempts", total=self.attempts * len(CLASSES)) if bar else None
        late = [c for c in CLASSES if c == "replay-late"]
        for cls in [c for c in CLASSES if c not in late]:
            for _ in range(self.attempts):
                self.attack(cls, self.now)
            if bar:
                bar.update(task, advance=self.attempts, description=f"forgery: {cls}")
        # the captured envelopes' lifetimes end; 11 minutes later their ids are forgotten
        self.now += LIFETIME_MS + 11 * 60_000
        self.prt.poll(self.now)
        for cls in late:
            for _ in range(self.attempts):
                self.attack(cls, self.now)
            if bar:
                bar.update(task, advance=self.attempts, description=f"forgery: {cls}")
        return {
            "genuine_delivered": got,
            "genuine_bundles_captured": len(self.captured),
            "report_acked_by": sorted(self.prt.store.member_acks(self.prt_report)),
            "classes": {c: dict(self.rows[c]) for c in CLASSES},
            "reasons": {c: dict(self.reasons[c].most_common()) for c in CLASSES},
        }

    def close(self) -> None:
        self.deu.store.close()
        self.prt.store.close()


def _reason(line: str) -> str:
    """The kind of a rejection line (`BundleResult.rejected`), for the report's counts."""
    for reason in ("malformed", "misrouted"):  # a message may name a tag's form: nothing was checked against a key
        if f"({reason})" in line:
            return reason
    for key in (
        "origin tag",
        "did not seal",
        "without origin tags",
        "sealed with",
        "bad tag",
        "tag",
        "expired",
        "unknown",
        "malformed",
        "version",
        "oversize",
    ):
        if key in line:
            return key
    return line.split(":")[0][:40]


def report(out: Path, res: dict, params: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"params": params, **res}, indent=1) + "\n")
    md = [
        "# Forged, tampered and replayed bundles (`c2dtn perf forgery`)",
        "",
        f"fmn-4nations' group keys; prt's overlay core took {res['genuine_delivered']} genuine envelopes from deu "
        f"first ({res['genuine_bundles_captured']} bundles captured for tampering and replay); then "
        f"{params['attempts']} bundles per class (seed {params['seed']}).",
        "",
        "| class | bundles | refused | taken as duplicates | dropped as expired | **accepted** | crashes | "
        "refused because |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in CLASSES:
        r, why = res["classes"][c], res["reasons"][c]
        md.append(
            f"| {c} | {r.get('bundles', 0)} | {r.get('refused', 0)} | {r.get('duplicates', 0)} | "
            f"{r.get('expired_or_stale', 0)} | "
            f"**{r.get('accepted', 0)}** | {r.get('crashes', 0)} | "
            + (", ".join(f"{k}: {n}" for k, n in why.items()) or "-")
            + " |"
        )
    forged = sum(res["classes"][c].get("accepted", 0) for c in CLASSES if c != "control")
    md += [
        "",
        f"Forged or replayed envelopes accepted (every class but the control): **{forged}**. The control "
        "(deu's own keys, as a compromised box has them) shows that an acceptance is seen.",
        "",
        "![per class](plot.png)",
    ]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    xs = list(range(len(CLASSES)))
    for k, (key, label) in enumerate(
        (("refused", "refused"), ("duplicates", "taken as duplicates"), ("accepted", "accepted as new"))
    ):
        ax.bar([x + (k - 1) * 0.27 for x in xs], [res["classes"][c].get(key, 0) for c in CLASSES], 0.27, label=label)
    ax.set_xticks(xs, CLASSES, rotation=20)
    ax.set_ylabel("envelopes or bundles")
    ax.set_title("What prt did with each class of hostile bundle")
    ax.legend()
    save_figure(fig, out / "plot.png")
    res["forged_accepted"] = forged
    return "\n".join(md[: len(CLASSES) + 8])


def main(attempts: int = 10_000, seed: int = 1, out: Path | None = None, console=None) -> tuple[Path, dict]:
    out = out or run_dir("forgery")
    with tempfile.TemporaryDirectory(prefix="c2forgery-") as td, progress(console) as bar:
        camp = Campaign(Path(td), attempts, seed)
        try:
            with tally_logs() as tally:  # a warning per refused bundle: counted, not printed
                res = camp.run(bar)
        finally:
            camp.close()
    res["logged_lines"] = sum(tally.counts.values())
    text = report(out, res, {"attempts": attempts, "seed": seed})
    if console is not None:
        console.print(text)
        console.print(f"results in {out}")
    return out, res
