"""Manifest validation: every refusal names the field path."""

from __future__ import annotations

import json

import pytest

from persys.model import ManifestError, parse_manifests

GOOD = """
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: web, labels: {app: web}}
spec:
  type: container
  resources: {cpuMillicores: 250, memoryMb: 128}
  container: {image: persys/busybox:latest, command: [httpd, -f]}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ManifestError) as exc:
        parse_manifests(text)
    return exc.value.problems


def test_good_manifest_round_trips() -> None:
    (m,) = parse_manifests(GOOD)
    assert m.metadata.name == "web"
    assert m.spec.resources.cpu_millicores == 250
    assert m.spec.container is not None and m.spec.container.image == "persys/busybox:latest"
    again = parse_manifests(str(m.to_doc()).replace("'", '"'))  # JSON is YAML too
    assert again[0].spec.spec_revision() == m.spec.spec_revision()


def test_revision_changes_with_spec_only() -> None:
    (a,) = parse_manifests(GOOD)
    (b,) = parse_manifests(GOOD.replace("memoryMb: 128", "memoryMb: 256"))
    (c,) = parse_manifests(GOOD.replace("app: web", "app: other"))
    assert a.spec.spec_revision() != b.spec.spec_revision()
    assert a.spec.spec_revision() == c.spec.spec_revision()


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("cpuMillicores: 250", "cpuMillicores: lots"), "spec.resources.cpuMillicores: Input should be a valid int"),
        (("memoryMb: 128", "memoryMb: 128, gpus: 1"), "spec.resources.gpus: unknown field"),
        (("image: persys/busybox:latest, ", ""), "spec.container.image: required field is missing"),
        (("type: container", "type: mainframe"), "spec.type: Input should be"),
        (("name: web,", "name: Web_1,"), "metadata.name: must be a DNS label"),
        (("apiVersion: persys.dev/v1", "apiVersion: v2"), "apiVersion: Input should be 'persys.dev/v1'"),
        (("type: container", "type: process"), "spec: type is 'process' but spec.process is missing"),
    ],
)
def test_bad_manifest_names_the_field(edit: tuple[str, str], expected: str) -> None:
    text = GOOD.replace(*edit)
    assert text != GOOD
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found


def test_every_problem_is_reported_at_once() -> None:
    text = GOOD.replace("cpuMillicores: 250", "cpuMillicores: -1").replace("image: persys/busybox:latest, ", "")
    found = problems(text)
    assert len(found) == 2
    assert any(p.startswith("spec.resources.cpuMillicores") for p in found)


def test_multi_document_is_all_or_nothing() -> None:
    found = problems(GOOD + "\n---\n" + GOOD.replace("cpuMillicores: 250", "cpuMillicores: x"))
    assert found and all(p.startswith("document 2:") for p in found)


@pytest.mark.parametrize("text", ["", "just a string", "a: [unclosed", "- 1\n- 2"])
def test_not_a_manifest(text: str) -> None:
    assert problems(text)


@pytest.mark.parametrize("user", ["../root", "root\n", "a b", "x" * 33, "-r", ""])
def test_a_process_user_is_a_name_or_uid(user: str) -> None:
    text = GOOD.replace("type: container", "type: process").replace(
        "container: {image: persys/busybox:latest, command: [httpd, -f]}",
        f"process: {{command: [id], user: {json.dumps(user)}}}")
    assert any(p.startswith("spec.process.user") for p in problems(text))


def test_an_unset_process_user_keeps_the_revision() -> None:
    text = GOOD.replace("type: container", "type: process").replace(
        "container: {image: persys/busybox:latest, command: [httpd, -f]}", "process: {command: [id]}")
    (m,) = parse_manifests(text)
    assert "user" not in str(m.spec.to_doc())  # specs written before the field hash the same
    (named,) = parse_manifests(text.replace("command: [id]", "command: [id], user: nobody"))
    assert named.spec.spec_revision() != m.spec.spec_revision()


@pytest.mark.parametrize(("where", "edit"), [
    ("spec.container.pullPolicy", ("command: [httpd, -f]}", "command: [httpd, -f], pullPolicy: Sometimes}")),
    ("spec.compose.pullPolicy", ("type: container", "type: compose")),
])
def test_pull_policy_is_one_of_three(where: str, edit: tuple[str, str]) -> None:
    text = GOOD.replace(*edit)
    if where.startswith("spec.compose"):
        text = text.replace("  container: {image: persys/busybox:latest, command: [httpd, -f]}",
                            "  compose: {inline: 'services: {a: {image: x}}', pullPolicy: always}")
    found = problems(text)
    assert any(p.startswith(f"{where}: Input should be 'IfNotPresent', 'Always' or 'Never'") for p in found), found


def test_pull_policy_in_the_revision_where_it_changes_what_runs() -> None:
    def revision(policy: str) -> str:
        extra = f", pullPolicy: {policy}" if policy else ""
        (m,) = parse_manifests(GOOD.replace("command: [httpd, -f]}", f"command: [httpd, -f]{extra}}}"))
        return m.spec.spec_revision()

    # Unset means IfNotPresent: writing it out keeps the revision (specs from before the field too).
    assert revision("") == revision("IfNotPresent")
    assert len({revision(""), revision("Always"), revision("Never")}) == 3
    (m,) = parse_manifests(GOOD)
    assert m.spec.pull_policy() == "IfNotPresent"
