"""docs/deploy/: the manifests validate against their schemas (Kubernetes' own kinds with
kubernetes-validate's bundled schemas, offline; KEDA's with the vendored schema beside this
test), say what the worker does (grace, probes), and the KEDA query counts what it claims to."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import trioq
from tests.support import make_app, scalar
from trioq.cli.worker import HARD_STOP_MARGIN_SECONDS

DEPLOY = Path(__file__).resolve().parent.parent / "docs" / "deploy"
KEDA_SCHEMAS = json.loads((Path(__file__).parent / "schemas" / "keda-v1alpha1.json").read_text())
KUBERNETES_VERSION = "1.30"


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


@pytest.mark.parametrize("name", sorted(path.name for path in DEPLOY.glob("*.yaml")))
def test_manifest_validates_against_its_schema(name: str) -> None:
    for doc in documents(name):
        if doc["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(doc, KEDA_SCHEMAS[doc["kind"]])
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_vendored_keda_schema_refuses_a_misspelt_field() -> None:
    [scaled, _] = documents("keda-scaledobject.yaml")
    scaled["spec"]["maxReplicas"] = scaled["spec"].pop("maxReplicaCount")
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        jsonschema.validate(scaled, KEDA_SCHEMAS["ScaledObject"])


def test_worker_deployment_probes_and_grace_follow_the_workers_own_bounds() -> None:
    [deployment] = documents("worker-deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    grace = float(
        next(arg for arg in container["args"] if arg.startswith("--grace=")).split("=")[1]
    )
    # Kubernetes must not SIGKILL before the worker's own hard stop at grace + margin.
    assert pod["terminationGracePeriodSeconds"] > grace + HARD_STOP_MARGIN_SECONDS
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_migrate_job_is_bounded_and_mentions_no_helm_hook_it_lacks() -> None:
    [job] = documents("migrate-job.yaml")
    assert job["spec"]["activeDeadlineSeconds"] > 0
    assert "helm" not in (DEPLOY / "migrate-job.yaml").read_text().lower()


def keda_trigger() -> dict[str, str]:
    [scaled, _] = documents("keda-scaledobject.yaml")
    [trigger] = scaled["spec"]["triggers"]
    metadata: dict[str, str] = trigger["metadata"]
    return metadata


async def test_keda_query_skips_paused_queues_and_one_due_job_activates(
    pg_url: str, pg_schema: str
) -> None:
    trigger = keda_trigger()
    query = re.sub(r"\btrioq\.", f"{pg_schema}.", trigger["query"])
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        assert await scalar(pg_url, query) == 0
        await client.enqueue(trioq.TaskDeclaration("work", queue="default"), {})
        value = await scalar(pg_url, query)
        # One due job activates a deployment at zero replicas: KEDA activates above the value.
        assert value == 1 and value > float(trigger["activationTargetQueryValue"])
        for _ in range(3):
            await client.enqueue(trioq.TaskDeclaration("work", queue="mail"), {})
        await client.enqueue(trioq.TaskDeclaration("work", queue="other"), {})  # not scaled
        assert await scalar(pg_url, query) == 4
        await client.pause_queue("mail")
        assert await scalar(pg_url, query) == 1  # the paused queue's 3 are not counted
        await client.resume_queue("mail")
        assert await scalar(pg_url, query) == 4
