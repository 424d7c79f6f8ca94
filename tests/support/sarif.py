"""The parts of SARIF 2.1.0 that code-scanning UIs require."""

from __future__ import annotations


def validate_sarif(log: dict, expected_results: int) -> None:
    """Assert the structure GitHub code scanning reads."""
    assert log["version"] == "2.1.0" and "sarif-2.1.0" in log["$schema"]
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "fxquant"
    rule_ids = [r["id"] for r in driver["rules"]]
    assert all(r["shortDescription"]["text"] for r in driver["rules"])
    assert len(run["results"]) == expected_results
    for invocation in run.get("invocations", []):  # a partial check's notification
        assert isinstance(invocation["executionSuccessful"], bool)
        for note in invocation.get("toolExecutionNotifications", []):
            assert note["message"]["text"] and note["level"] in {"error", "warning", "note"}
    for result in run["results"]:
        assert result["ruleId"] in rule_ids and rule_ids[result["ruleIndex"]] == result["ruleId"]
        assert result["level"] in {"error", "warning", "note", "none"}
        assert result["message"]["text"]
        for loc in result.get("locations", []):
            phys = loc["physicalLocation"]
            assert phys["artifactLocation"]["uri"]
            assert phys["region"]["startLine"] >= 1
