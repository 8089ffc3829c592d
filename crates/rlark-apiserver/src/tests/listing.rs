//! Lists: selectors, paging, resourceVersion semantics.

use http::StatusCode;
use serde_json::{Value, json};

use super::*;

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

async fn labelled_leases(h: &Harness) {
    for (i, team) in ["a", "b", "a", "b", "a"].iter().enumerate() {
        let mut body = lease("default", &format!("l{i}"));
        body["metadata"]["labels"] = json!({"team": team, "n": i.to_string()});
        h.create(&leases("default"), &body).await;
    }
}

#[tokio::test]
async fn label_and_field_selectors() {
    let h = Harness::new().await;
    labelled_leases(&h).await;
    let list = |query: &str| {
        let uri = format!("{}?{query}", leases("default"));
        let h = &h;
        async move { h.get(&uri).await }
    };
    assert_eq!(
        names(&list("labelSelector=team%3Da").await.body),
        vec!["l0", "l2", "l4"]
    );
    assert_eq!(
        names(&list("labelSelector=team+in+(b)%2Cn!%3D1").await.body),
        vec!["l3"]
    );
    assert_eq!(
        names(&list("labelSelector=n%3E2").await.body),
        vec!["l3", "l4"]
    );
    assert_eq!(
        names(&list("labelSelector=!team").await.body),
        Vec::<String>::new()
    );
    assert_eq!(
        names(&list("fieldSelector=metadata.name%3Dl1").await.body),
        vec!["l1"]
    );
    assert_eq!(names(&list("fieldSelector=metadata.name!%3Dl1,metadata.namespace%3Ddefault&labelSelector=team%3Db").await.body), vec!["l3"]);

    let bad = list("labelSelector=team+in+b").await;
    assert_eq!(
        (bad.status, bad.reason()),
        (StatusCode::BAD_REQUEST, "BadRequest")
    );
    assert!(bad.message().contains("team in b"), "{}", bad.message());
    let bad = list("fieldSelector=spec.holderIdentity%3Dme").await;
    assert_eq!(
        (bad.status, bad.message()),
        (
            StatusCode::BAD_REQUEST,
            "field label not supported: spec.holderIdentity"
        )
    );

    // Namespaces select on status.phase.
    h.create(NAMESPACES, &namespace("dev")).await;
    let active = h
        .get(&format!("{NAMESPACES}?fieldSelector=status.phase%3DActive"))
        .await;
    assert_eq!(names(&active.body), vec!["default", "dev"]);
    let terminating = h
        .get(&format!(
            "{NAMESPACES}?fieldSelector=status.phase%3DTerminating"
        ))
        .await;
    assert!(names(&terminating.body).is_empty());
}

#[tokio::test]
async fn paging_with_limit_and_continue() {
    let h = Harness::new().await;
    labelled_leases(&h).await;
    let first = h.get(&format!("{}?&limit=2", leases("default"))).await;
    assert_eq!(names(&first.body), vec!["l0", "l1"]);
    assert_eq!(first.body["metadata"]["remainingItemCount"], 3);
    let rv = first.body["metadata"]["resourceVersion"].clone();
    let token = first.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();

    // A write between pages: later pages report the first page's revision and are read at
    // it (one snapshot, from the change log), so `l9` is not in them.
    h.create(&leases("default"), &lease("default", "l9")).await;
    let second = h
        .get(&format!("{}?limit=2&continue={token}", leases("default")))
        .await;
    assert_eq!(names(&second.body), vec!["l2", "l3"]);
    assert_eq!(second.body["metadata"]["resourceVersion"], rv);
    let token = second.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    let last = h
        .get(&format!("{}?limit=2&continue={token}", leases("default")))
        .await;
    assert_eq!(names(&last.body), vec!["l4"]);
    assert!(last.body["metadata"].get("continue").is_none());
    assert!(last.body["metadata"].get("remainingItemCount").is_none());

    // Selectors apply before the limit.
    let page = h
        .get(&format!(
            "{}?labelSelector=team%3Da&limit=2",
            leases("default")
        ))
        .await;
    assert_eq!(names(&page.body), vec!["l0", "l2"]);
    assert!(page.body["metadata"].get("remainingItemCount").is_none());
    let token = page.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    let page = h
        .get(&format!(
            "{}?labelSelector=team%3Da&limit=2&continue={token}",
            leases("default")
        ))
        .await;
    assert_eq!(names(&page.body), vec!["l4"]);

    let bad = h
        .get(&format!("{}?continue=garbage", leases("default")))
        .await;
    assert_eq!(
        (bad.status, bad.reason()),
        (StatusCode::BAD_REQUEST, "BadRequest")
    );
    let bad = h
        .get(&format!(
            "{}?continue={token}&resourceVersion=5",
            leases("default")
        ))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    // A token older than the change log is 410 (the client relists).
    h.create(&leases("default"), &lease("default", "l10")).await;
    h.store.compact(h.revision()).await.unwrap();
    let gone = h
        .get(&format!("{}?limit=2&continue={token}", leases("default")))
        .await;
    assert_eq!((gone.status, gone.reason()), (StatusCode::GONE, "Expired"));
}

#[tokio::test]
async fn resource_version_semantics() {
    let h = Harness::new().await;
    h.create(JOBS, &job("a")).await;
    let current = h.revision();
    let list = h.get(JOBS).await;
    assert_eq!(list.body["kind"], "JobList");
    assert_eq!(list.body["apiVersion"], "rlinf.io/v1alpha1");
    assert_eq!(list.rv(), current);
    assert_eq!(list.body["items"][0]["kind"], "Job");

    for query in [
        "resourceVersion=0",
        "resourceVersion=0&resourceVersionMatch=NotOlderThan",
        &format!("resourceVersion={current}"),
        &format!("resourceVersion={current}&resourceVersionMatch=Exact"),
        "resourceVersion=1&resourceVersionMatch=NotOlderThan",
    ] {
        let answer = h.get(&format!("{JOBS}?{query}")).await;
        assert_eq!(answer.status, StatusCode::OK, "{query}: {}", answer.body);
        assert_eq!(names(&answer.body), vec!["a"], "{query}");
    }
    // An older revision the change log still holds is served as it was then: before `a`.
    let old = h
        .get(&format!(
            "{JOBS}?resourceVersion={}&resourceVersionMatch=Exact",
            current - 1
        ))
        .await;
    assert_eq!(old.status, StatusCode::OK, "{}", old.body);
    assert_eq!(old.rv(), current - 1);
    assert!(names(&old.body).is_empty(), "{}", old.body);
    let bad = h.get(&format!("{JOBS}?resourceVersionMatch=Exact")).await;
    assert_eq!(
        (bad.status, bad.reason()),
        (StatusCode::UNPROCESSABLE_ENTITY, "Invalid")
    );

    // A revision from the future: wait for the store, then 504.
    let started = tokio::time::Instant::now();
    let future = h
        .get(&format!(
            "{JOBS}?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            current + 100
        ))
        .await;
    assert_eq!(
        (future.status, future.reason()),
        (StatusCode::GATEWAY_TIMEOUT, "Timeout")
    );
    assert!(
        future.message().starts_with("Too large resource version"),
        "{}",
        future.message()
    );
    assert_eq!(
        future.causes(),
        vec![(String::new(), "ResourceVersionTooLarge".to_string())]
    );
    assert!(started.elapsed() >= crate::list::MAX_WAIT_FOR_REVISION);

    // ... but a revision reached while waiting is served.
    let target = current + 1;
    let waiting = {
        let uri = format!("{JOBS}?resourceVersion={target}&resourceVersionMatch=NotOlderThan");
        let h = &h;
        async move { h.get(&uri).await }
    };
    let writer = async {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        h.create(JOBS, &job("b")).await;
    };
    let (answer, ()) = tokio::join!(waiting, writer);
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(names(&answer.body), vec!["a", "b"]);

    // `Exact` at a revision before `b`: as it was then. Below the change log's floor: 410.
    let exact = h
        .get(&format!(
            "{JOBS}?resourceVersion={current}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(exact.status, StatusCode::OK, "{}", exact.body);
    assert_eq!(names(&exact.body), vec!["a"], "b came after");
    h.store.compact(current).await.unwrap();
    let old = h
        .get(&format!(
            "{JOBS}?resourceVersion={}&resourceVersionMatch=Exact",
            current - 1
        ))
        .await;
    assert_eq!((old.status, old.reason()), (StatusCode::GONE, "Expired"));
}
