import logging

from c2dtn.spells import Spell


def test_a_lasting_condition_is_logged_once_then_summed_up_and_its_end_told(caplog):
    t = [0.0]
    s = Spell(logging.getLogger("c2dtn.test"), every_s=60, clock=lambda: t[0])
    with caplog.at_level(logging.INFO, "c2dtn.test"):
        for i in range(500):  # 500 refusals over 100 s
            t[0] = i * 0.2
            s.hit("custody full: %s", "disk")
        s.over("custody takes again")
        s.hit("custody full: %s", "disk")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "custody full: disk (logged once while this lasts)"
    assert lines[1] == "custody full: disk (300 more times in the last 60 s; 60 s since it began)"
    assert lines[2] == "custody takes again (after 500 times in 100 s)"
    assert lines[3] == "custody full: disk (logged once while this lasts)" and len(lines) == 4
