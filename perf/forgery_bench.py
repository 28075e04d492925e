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
  splice            a genuine deu group bundle, its origin tags kept, nor's envelope inside
  splice-wrapped    a genuine deu group bundle with nor's envelope (deu named as origin) appended
                    as a byte string holding [map, tag]: a form the origin tags once did not cover
  splice-wrapped-ack  the same with a "done" ack in deu's name for a report prt holds for the group
  mutate            a genuine deu group bundle under 1-3 structural mutations of its container
                    (an item wrapped, nested or reshaped, items reordered, duplicated, dropped or
                    added, origin tags reordered or duplicated), added items re-sealed by nor
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
    "splice-wrapped",
    "splice-wrapped-ack",
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
MUTATIONS = ("wrap", "nest", "reshape", "reorder", "duplicate", "drop", "add", "add-wrapped", "replace", "tags")


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
        from c2dtn.overlay.envelope import ITEMS_AT, Codec

        lie = b"deu: fall back to phase line red %d" % self.seq
        st = self._stamp()
        if cls == "spoof-untagged":
            as_deu = codec("nor", "deu")
            bundle = as_deu.container([as_deu.seal(self._env(GROUP, lie), stamp=st)], GROUP, st)
            return cbor2.dumps(cbor2.loads(bundle)[: ITEMS_AT + 1])
        if cls == "spoof-tagged":
            as_deu = codec("nor", "deu")
            return as_deu.container([as_deu.seal(self._env(GROUP, lie), stamp=st)], GROUP, st)
        if cls == "splice":  # nor's envelope sealed with the genuine bundle's own stamp
            spliced = cbor2.loads(self.rng.choice(self._group_bundles()))
            st = (spliced[3], spliced[4])
            spliced[ITEMS_AT] = [cbor2.loads(codec("nor", "deu").seal(self._env(GROUP, lie), stamp=st))]
            return cbor2.dumps(spliced)
        if cls in ("splice-wrapped", "splice-wrapped-ack"):
            spliced = cbor2.loads(self.rng.choice(self._group_bundles()))
            st = (spliced[3], spliced[4])
            forged = (
                self._ack(self.prt_report)
                if cls.endswith("ack")
                else self._env(GROUP, lie, priority=self.Priority.FLASH)
            )
            spliced[ITEMS_AT].append(
                codec("nor", "deu").seal(forged, stamp=st)
            )  # bytes: the sealed [ciphertext, tag], wrapped
            return cbor2.dumps(spliced)
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
            return as_group.container([as_group.seal(env, stamp=st)], stamp=st)
        if cls == "spoof-pair":
            as_deu = Codec("deu", {"prt": pair_key("nor", "prt")})
            return as_deu.container([as_deu.seal(self._env("prt", lie), stamp=st)], stamp=st)
        if cls == "outsider":
            stranger = Codec(
                "deu", {n: self.rng.randbytes(32) for n in ("nor", "prt", "usa", GROUP)}, {GROUP: ("nor", "prt", "usa")}
            )
            dst = self.rng.choice(["prt", GROUP])
            return stranger.container([stranger.seal(self._env(dst, lie), stamp=st)], dst, st)
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
            return deu.container([deu.seal(self._env(dst, b"deu (compromised) %d" % self.seq), stamp=st)], dst, st)
        raise ValueError(f"unknown class {cls!r}: " + ", ".join(CLASSES))

    def _group_bundles(self) -> list[bytes]:
        """The captured bundles for the group (with origin tags after the envelopes), found once."""
        from c2dtn.overlay.envelope import ITEMS_AT

        if self._groups is None:
            self._groups = [p for p in self.captured if len(cbor2.loads(p)) == ITEMS_AT + 2]
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

    def _mutate(self, obj: list, lie: bytes) -> list:
        """1-3 structural mutations of a genuine group container (MUTATIONS); added items are
        nor's, sealed with the group key, deu's name as their origin and the container's stamp."""
        from c2dtn.overlay.envelope import ITEMS_AT

        items, forger, st = obj[ITEMS_AT], codec("nor", "deu"), (obj[3], obj[4])
        for m in self.rng.sample(MUTATIONS, self.rng.randint(1, 3)):
            i = self.rng.randrange(len(items)) if items else 0
            fresh = forger.seal(self.rng.choice([self._env(GROUP, lie), self._ack(self.prt_report)]), stamp=st)
            if m == "wrap" and items:
                items[i] = cbor2.dumps(items[i])
            elif m == "nest" and items:
                items[i] = [items[i]]
            elif m == "reshape" and items and isinstance(items[i], list) and len(items[i]) == 2:
                items[i] = self.rng.choice(
                    [
                        [*items[i], b""],
                        items[i][:1],
                        items[i][::-1],
                        [items[i][0], items[i][1][:8]],
                        {0: items[i][0], 1: items[i][1]},
                    ]
                )
            elif m == "reorder":
                self.rng.shuffle(items)
            elif m == "duplicate" and items:
                items.insert(self.rng.randrange(len(items) + 1), items[i])
            elif m == "drop" and len(items) > 1:
                del items[i]
            elif m == "add":
                items.insert(self.rng.randrange(len(items) + 1), cbor2.loads(fresh))
            elif m == "add-wrapped":
                items.insert(self.rng.randrange(len(items) + 1), fresh)
            elif m == "replace" and items:
                items[i] = cbor2.loads(fresh)
            elif m == "tags" and obj[ITEMS_AT + 1]:
                t = obj[ITEMS_AT + 1]
                obj[ITEMS_AT + 1] = self.rng.choice([t[::-1], t + t[:1], t[1:]])
        return obj

    def _genuine_acks(self, payload: bytes) -> int:
        """Ack envelopes of deu's own in a bundle that are genuine (spliced bundles start from one)."""
        from c2dtn.overlay.envelope import ITEMS_AT, EnvelopeError, Kind

        try:
            obj = cbor2.loads(payload)
            lists = [it for it in obj[ITEMS_AT] if isinstance(it, list)]
            c = self.prt.codec.open_container(cbor2.dumps(obj[:ITEMS_AT] + [lists] + obj[ITEMS_AT + 1 :]))
            return sum(self.prt.codec.open(c.sender, it, c).kind == Kind.ACK for it in c.items)
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
        if cls in ("splice-wrapped-ack", "mutate", "as-group"):  # an ack taken in another's name is a forgery taken
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
