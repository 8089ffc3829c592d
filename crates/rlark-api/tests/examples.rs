//! Every manifest under `examples/` is accepted by `validate`.

use std::path::PathBuf;

use rlark_api::API_VERSION;
use rlark_api::validation::validate;
use serde_json::Value;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Every document of every `examples/*.yaml`, as `(file, document)`.
fn documents() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let parsed: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        docs.extend(parsed.into_iter().map(|doc| (name.clone(), doc)));
    }
    docs
}

#[test]
fn every_example_is_valid() {
    let docs = documents();
    assert!(!docs.is_empty());
    for (file, doc) in &docs {
        assert_eq!(doc["apiVersion"], API_VERSION, "{file}");
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no kind"));
        if let Err(errors) = validate(kind, doc) {
            let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
            panic!("{file}: {kind} rejected:\n{}", list.join("\n"));
        }
    }
}

#[test]
fn the_promised_examples_exist() {
    let docs = documents();
    let find = |kind: &str, name: &str| {
        docs.iter()
            .map(|(_, d)| d)
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} {name} in examples/"))
    };
    let domain = find("Domain", "demo-net");
    assert_eq!(domain["spec"]["cidr"], "10.88.0.0/16");

    let job = find("Job", "ppo-train");
    assert_eq!(job["spec"]["domain"], "demo-net");
    let tasks = job["spec"]["tasks"].as_array().unwrap();
    let names: Vec<&str> = tasks.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["actor", "rollout"]);
    assert_eq!(tasks[0]["head"], true);
    assert_eq!(tasks[0]["agentType"], "Raw");
    assert_eq!(tasks[1]["raw"]["replicas"], 2);
    assert_eq!(tasks[1]["nodeSelector"]["rlark.io/node-category"], "edge");

    // Templates are listed out of dependency order: `report` before what it waits for.
    let wf = find("Workflow", "train-eval");
    let templates = wf["spec"]["jobTemplates"].as_array().unwrap();
    let order: Vec<&str> = templates
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    let pos = |n: &str| order.iter().position(|x| *x == n).unwrap();
    assert!(pos("report") < pos("eval-a") && pos("eval-a") < pos("train"));
    assert_eq!(
        templates[pos("report")]["dependencies"],
        serde_json::json!(["eval-a", "eval-b"])
    );
    assert_eq!(
        templates[pos("eval-b")]["dependencies"],
        serde_json::json!(["train"])
    );
}
