"""JUnit XML: every check (threshold, regression) a test case, plus one passing case per
scenario carrying its prediction, so CI systems list them natively."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from whatif.documents import ReportDocument

from .markdown import ms


def render_junit(report: ReportDocument) -> str:
    """The ``<testsuites>`` document as a string (UTF-8, with an XML declaration)."""
    checks = report.checks
    scenarios = report.prediction.scenarios
    failures = sum(c.status == "failed" for c in checks)
    skipped = sum(c.status == "skipped" for c in checks)
    tests = len(checks) + len(scenarios)
    counts = {"tests": str(tests), "failures": str(failures), "errors": "0", "skipped": str(skipped), "time": "0"}
    root = ET.Element("testsuites", {"name": "whatif", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": f"whatif report {report.source}", **counts})
    props = ET.SubElement(suite, "properties")
    for key, value in (("source", report.source), ("device", report.device), ("whatif_version", report.whatif_version),
                       ("status", report.status)):
        ET.SubElement(props, "property", {"name": key, "value": str(value or "unknown")})
    for c in checks:
        case = ET.SubElement(suite, "testcase", {"classname": f"whatif.{c.kind}", "name": c.name, "time": "0"})
        if c.status == "failed":
            ET.SubElement(case, "failure", {"message": c.message, "type": c.kind}).text = f"{c.name} holds: {c.message}"
        elif c.status == "skipped":
            ET.SubElement(case, "skipped", {"message": c.message})
        else:
            ET.SubElement(case, "system-out").text = c.message
    base_ns = report.prediction.baseline.mean_step_ns
    for s in scenarios:
        case = ET.SubElement(suite, "testcase", {"classname": "whatif.scenario", "name": s.name, "time": "0"})
        ET.SubElement(case, "system-out").text = (f"predicted mean step {ms(s.mean_step_ns)} ms "
                                                  f"(baseline {ms(base_ns)} ms), speedup {s.speedup:.3f}x")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
