"""`c2dtn perf paho-interop` without the suite at hand: what it reads of a checkout, and the
clear error for a folder that is not one (the run itself needs paho.mqtt.testing, which no
registry here serves: docs/decisions/0003-mqtt-conformance.md)."""

import pytest
from click.testing import CliRunner

from c2dtn.perf import paho_interop
from c2dtn.perf.cli import perf


def test_the_tests_of_a_suite_file_are_found_by_name(tmp_path):
    (tmp_path / "client_test5.py").write_text(
        "class Test:\n    def test_basic(self):\n        pass\n\n"
        "    def test_will_message(self):\n        pass\n"
        "    def helper(self):\n        pass\n"
    )
    assert paho_interop.test_names(tmp_path, "client_test5") == ["test_basic", "test_will_message"]


def test_a_folder_that_is_not_the_suite_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path)):
        paho_interop.main(tmp_path)
    r = CliRunner().invoke(perf, ["paho-interop", "--suite", str(tmp_path)])
    assert r.exit_code == 2 and "no client_test5.py" in r.output
