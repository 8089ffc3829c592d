"""The official Python Kubernetes client, unmodified, against rlark's API server."""

import threading

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

GROUP, VERSION = "rlinf.io", "v1alpha1"


def job(name, phase_hint="demo"):
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"purpose": phase_hint}},
        "spec": {
            "tasks": [
                {
                    "name": "actor",
                    "role": "Actor",
                    "agentType": "Raw",
                    "head": True,
                    "raw": {"entrypoint": ["python3", "-c", "print('hi')"]},
                }
            ]
        },
    }


@pytest.fixture(scope="module")
def api(rlark_server):
    api_client = config.new_client_from_config(config_file=rlark_server)
    yield api_client
    api_client.close()


def test_lists_namespaces_and_jobs(api):
    core = client.CoreV1Api(api)
    names = [ns.metadata.name for ns in core.list_namespace().items]
    assert "default" in names

    custom = client.CustomObjectsApi(api)
    custom.create_cluster_custom_object(GROUP, VERSION, "jobs", job("py-list-a"))
    custom.create_cluster_custom_object(GROUP, VERSION, "jobs", job("py-list-b", "other"))
    listed = custom.list_cluster_custom_object(GROUP, VERSION, "jobs")
    names = {item["metadata"]["name"] for item in listed["items"]}
    assert {"py-list-a", "py-list-b"} <= names
    assert listed["metadata"]["resourceVersion"]

    selected = custom.list_cluster_custom_object(GROUP, VERSION, "jobs", label_selector="purpose=other")
    assert [item["metadata"]["name"] for item in selected["items"]] == ["py-list-b"]


def test_watch_streams_changes(api):
    custom = client.CustomObjectsApi(api)
    start = custom.list_cluster_custom_object(GROUP, VERSION, "jobs")["metadata"]["resourceVersion"]

    def writer():
        custom.create_cluster_custom_object(GROUP, VERSION, "jobs", job("py-watch"))
        custom.patch_cluster_custom_object(GROUP, VERSION, "jobs", "py-watch", {"spec": {"stopped": True}})
        custom.delete_cluster_custom_object(GROUP, VERSION, "jobs", "py-watch")

    thread = threading.Thread(target=writer)
    thread.start()
    seen = []
    w = watch.Watch()
    for event in w.stream(
        custom.list_cluster_custom_object,
        GROUP,
        VERSION,
        "jobs",
        resource_version=start,
        timeout_seconds=20,
    ):
        if event["object"]["metadata"]["name"] != "py-watch":
            continue
        seen.append(event["type"])
        if event["type"] == "MODIFIED":
            assert event["object"]["spec"]["stopped"] is True
        if event["type"] == "DELETED":
            w.stop()
    thread.join()
    assert seen == ["ADDED", "MODIFIED", "DELETED"]


def test_errors_are_status_objects(api):
    custom = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as missing:
        custom.get_cluster_custom_object(GROUP, VERSION, "jobs", "does-not-exist")
    assert missing.value.status == 404

    bad = job("py-bad")
    bad["spec"]["tasks"][0]["role"] = "Driver"
    with pytest.raises(ApiException) as invalid:
        custom.create_cluster_custom_object(GROUP, VERSION, "jobs", bad)
    assert invalid.value.status == 422
    assert "role" in invalid.value.body
