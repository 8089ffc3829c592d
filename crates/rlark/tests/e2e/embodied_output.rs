//! Issue 18, item 8: `rlark robot list` and `rlark camera list` take `-o json|yaml` as the
//! server's listing commands do, against a real `rlark embodied` serving
//! `examples/embodied/sim.yaml`.

use crate::embodied_common;
use embodied_common::{Embodied, ok};
use serde_json::{Value, json};

/// The fields of `item` named in `expected`, for an exact comparison of those.
fn pick(item: &Value, expected: &Value) -> Value {
    let keys = expected
        .as_object()
        .map(|m| m.keys().cloned().collect::<Vec<_>>());
    let picked: serde_json::Map<String, Value> = keys
        .unwrap_or_default()
        .into_iter()
        .map(|k| (k.clone(), item[&k].clone()))
        .collect();
    Value::Object(picked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn robot_and_camera_lists_print_json_and_yaml() -> anyhow::Result<()> {
    let mut server = Embodied::start()?;
    server.first_list("robot").await?;

    let out = ok(
        server.cli("robot", &["list", "-o", "json"]).await?,
        "robot list -o json",
    )?;
    let list: Value = serde_json::from_str(&out)?;
    assert_eq!(list["kind"], "RobotList", "{out}");
    let items = list["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "{out}");
    let expected = json!({
        "id": "arm-0",
        "type": "sim-arm",
        "backend": "sim",
        "state": "STOPPED",
        "mode": "",
        "ownerPid": 0,
        "rosMasterUri": "",
        "message": "",
    });
    assert_eq!(pick(&items[0], &expected), expected, "{out}");

    let out = ok(
        server.cli("robot", &["list", "-o", "yaml"]).await?,
        "robot list -o yaml",
    )?;
    let from_yaml: Value = serde_saphyr::from_str(&out)?;
    assert_eq!(from_yaml, list, "YAML and JSON say the same");

    let out = ok(
        server.cli("camera", &["list", "-o", "json"]).await?,
        "camera list -o json",
    )?;
    let list: Value = serde_json::from_str(&out)?;
    assert_eq!(list["kind"], "CameraList", "{out}");
    let items = list["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "{out}");
    let expected = json!({
        "id": "cam-0",
        "type": "sim",
        "state": "CLOSED",
        "width": 640,
        "height": 480,
        "fps": 30,
        "encoding": "jpeg",
        "name": "cam-0",
        "lastSequence": 0,
    });
    assert_eq!(pick(&items[0], &expected), expected, "{out}");
    let out = ok(
        server.cli("camera", &["list", "-o", "yaml"]).await?,
        "camera list -o yaml",
    )?;
    let from_yaml: Value = serde_saphyr::from_str(&out)?;
    assert_eq!(from_yaml, list);

    let bad = server.cli("robot", &["list", "-o", "wide"]).await?;
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("[possible values: json, yaml]"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    Ok(())
}

/// `robot status` and `camera info` take `-o json|yaml` too: the object is the one their
/// list prints as an item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn robot_status_and_camera_info_print_json_and_yaml() -> anyhow::Result<()> {
    let mut server = Embodied::start()?;
    server.first_list("robot").await?;

    let listed: Value = serde_json::from_str(&ok(
        server.cli("robot", &["list", "-o", "json"]).await?,
        "robot list -o json",
    )?)?;
    let out = ok(
        server
            .cli("robot", &["status", "arm-0", "-o", "json"])
            .await?,
        "robot status -o json",
    )?;
    let robot: Value = serde_json::from_str(&out)?;
    assert_eq!(robot, listed["items"][0], "{out}");
    assert_eq!(robot["id"], "arm-0");
    assert_eq!(robot["state"], "STOPPED", "the state by name: {out}");
    let out = ok(
        server
            .cli("robot", &["status", "arm-0", "-o", "yaml"])
            .await?,
        "robot status -o yaml",
    )?;
    let from_yaml: Value = serde_saphyr::from_str(&out)?;
    assert_eq!(from_yaml, robot, "YAML and JSON say the same");

    let listed: Value = serde_json::from_str(&ok(
        server.cli("camera", &["list", "-o", "json"]).await?,
        "camera list -o json",
    )?)?;
    let out = ok(
        server
            .cli("camera", &["info", "cam-0", "-o", "json"])
            .await?,
        "camera info -o json",
    )?;
    let camera: Value = serde_json::from_str(&out)?;
    assert_eq!(camera, listed["items"][0], "{out}");
    assert_eq!(camera["state"], "CLOSED", "{out}");
    let out = ok(
        server
            .cli("camera", &["info", "cam-0", "-o", "yaml"])
            .await?,
        "camera info -o yaml",
    )?;
    let from_yaml: Value = serde_saphyr::from_str(&out)?;
    assert_eq!(from_yaml, camera);

    for (command, args) in [
        ("robot", ["status", "arm-0", "-o", "wide"]),
        ("camera", ["info", "cam-0", "-o", "wide"]),
    ] {
        let bad = server.cli(command, &args).await?;
        assert_eq!(bad.status.code(), Some(2), "{command} {args:?}");
        let stderr = String::from_utf8_lossy(&bad.stderr);
        assert!(stderr.contains("[possible values: json, yaml]"), "{stderr}");
    }
    let missing = server
        .cli("robot", &["status", "arm-9", "-o", "json"])
        .await?;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        missing.stdout.is_empty(),
        "nothing on stdout for a missing robot"
    );
    Ok(())
}
