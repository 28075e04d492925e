"""`c2dtn perf forgery` in short (issue 17: group forgery and replay, measured): no forged,
tampered or replayed envelope is taken, each refusal is typed, and the control (a
compromised box's own keys) shows that the campaign sees an acceptance."""

import json

import pytest

from c2dtn.perf import forgery_bench


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("forgery")
    return forgery_bench.main(attempts=60, seed=3, out=out)


def test_no_forged_tampered_or_replayed_envelope_is_taken(run):
    _, res = run
    for cls in forgery_bench.CLASSES[:-1]:
        r = res["classes"][cls]
        assert r["bundles"] == 60 and r.get("accepted", 0) == 0 and r.get("crashes", 0) == 0, (cls, r)
    for cls in (
        "spoof-untagged",
        "spoof-tagged",
        "splice",
        "splice-added",
        "splice-added-ack",
        "as-group",
        "spoof-pair",
        "outsider",
    ):
        assert res["classes"][cls]["refused"] == 60, cls
    assert set(res["reasons"]["splice"]) == {"origin tag"}
    # a bundle's stamp moved on the way: every envelope fails its tag (the group's: their origin tags first)
    assert res["classes"]["restamp"]["refused"] >= 60 and set(res["reasons"]["restamp"]) <= {"tag", "origin tag"}
    # nor can seal deu's envelopes again with its own added, but not make deu's origin tags cover that
    assert set(res["reasons"]["splice-added"]) == set(res["reasons"]["splice-added-ack"]) == {"origin tag"}
    # every mutated bundle refused (a line at least), or deu's own envelopes taken again as duplicates where
    # the mutation left deu's seal and prt's own origin tag as they were (the other members' tags reordered)
    m = res["classes"]["mutate"]
    assert m["refused"] + m.get("duplicates", 0) >= 60 and m["refused"] >= 50
    assert res["report_acked_by"] == []  # no forged ack recorded a member's "done" for prt's report
    assert res["classes"]["replay"]["duplicates"] > 0
    assert res["classes"]["replay-late"].get("expired_or_stale", 0) > 0  # the receiver's clock refused them
    assert res["forged_accepted"] == 0


def test_the_control_is_taken_so_the_campaign_can_see_an_acceptance(run):
    _, res = run
    assert res["classes"]["control"]["accepted"] == 60


def test_the_report_and_plot_are_the_runs_own(run):
    out, res = run
    md = (out / "report.md").read_text()
    t = res["classes"]["tamper"]
    assert f"| tamper | 60 | {t['refused']} | {t.get('duplicates', 0)} |" in md
    plot = json.loads((out / "plot.json").read_text())
    acc = next(s for s in plot[0]["series"] if s["label"] == "accepted as new")
    assert acc["y"] == [res["classes"][c].get("accepted", 0) for c in forgery_bench.CLASSES]
