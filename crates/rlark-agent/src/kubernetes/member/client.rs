//! The member cluster's client: built from `--member-kubeconfig` or in-cluster config,
//! checked at start, and the workload calls of the reconciler.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Secret, Service};
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use super::{MemberError, MemberOptions};
use crate::kubernetes::cloneset::{self, CloneSet};
use crate::kubernetes::workload::{MemberObjects, Workload};

/// The member cluster: its client and the workload namespace.
#[derive(Clone)]
pub struct MemberClient {
    /// Client of the member cluster's API.
    pub client: kube::Client,
    /// Namespace the workloads are created in.
    pub namespace: String,
    /// The API server's URL (for messages).
    pub server: String,
    /// Whether the member serves OpenKruise's CloneSet (discovery at [`connect`]).
    pub serves_cloneset: bool,
}

impl std::fmt::Debug for MemberClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberClient")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("serves_cloneset", &self.serves_cloneset)
            .finish_non_exhaustive()
    }
}

/// Build the member client from `options`, ask the member API for its version (an API
/// that does not answer stops the agent with a message naming it), and make sure the
/// workload namespace exists (created when missing).
pub async fn connect(options: &MemberOptions) -> Result<MemberClient, MemberError> {
    let config = match &options.kubeconfig {
        Some(path) => {
            let bad = |reason: String| MemberError::Kubeconfig {
                path: path.clone(),
                reason,
            };
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        None => kube::Config::incluster().map_err(|e| MemberError::NoConfig(e.to_string()))?,
    };
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|e| MemberError::Unreachable {
        server: server.clone(),
        reason: e.to_string(),
    })?;
    let version = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        client.apiserver_version(),
    )
    .await
    .map_err(|_| MemberError::Unreachable {
        server: server.clone(),
        reason: "no answer to GET /version within 15s".into(),
    })?
    .map_err(|e| MemberError::Unreachable {
        server: server.clone(),
        reason: e.to_string(),
    })?;
    tracing::info!(%server, version = %version.git_version, namespace = %options.namespace, "member cluster");
    ensure_namespace(&client, &options.namespace).await?;
    let serves_cloneset = serves_cloneset(&client).await;
    Ok(MemberClient {
        client,
        namespace: options.namespace.clone(),
        server,
        serves_cloneset,
    })
}

/// Whether the member lists OpenKruise's `clonesets` under `apps.kruise.io/v1alpha1`
/// (looked up once, when the agent starts; a member that does not answer is taken as not
/// serving it, said in the log).
async fn serves_cloneset(client: &kube::Client) -> bool {
    match client.list_api_group_resources(cloneset::API_VERSION).await {
        Ok(list) => {
            let served = list
                .resources
                .iter()
                .any(|r| r.name == cloneset::SERVED_RESOURCE);
            tracing::info!(
                served,
                api = cloneset::API_VERSION,
                "OpenKruise CloneSet on the member cluster"
            );
            served
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            tracing::info!(
                api = cloneset::API_VERSION,
                "the member cluster does not serve OpenKruise's CloneSet: CloneSet tasks are placed elsewhere"
            );
            false
        }
        Err(error) => {
            tracing::warn!(%error, api = cloneset::API_VERSION, "could not look up OpenKruise's CloneSet on the member cluster; taken as not served");
            false
        }
    }
}

/// Create namespace `name` unless it exists. A client that may not read namespaces (RBAC
/// limited to the workload namespace) is trusted to have it.
async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<(), MemberError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let fail = |reason: String| MemberError::Namespace {
        namespace: name.to_string(),
        reason,
    };
    match api.get_opt(name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => {
            let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))
                .map_err(|e| fail(e.to_string()))?;
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => {
                    tracing::info!(namespace = %name, "created the member workload namespace");
                    Ok(())
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(fail(format!("missing, and creating it failed: {e}"))),
            }
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::warn!(namespace = %name, "may not read namespaces of the member cluster; assuming the workload namespace exists");
            Ok(())
        }
        Err(e) => Err(fail(e.to_string())),
    }
}

impl MemberClient {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Create the workload; returns it as the member API stored it (with its UID).
    pub async fn create_workload(&self, workload: &Workload) -> Result<Workload, kube::Error> {
        let pp = PostParams::default();
        Ok(match workload {
            Workload::Deployment(o) => Workload::Deployment(self.api().create(&pp, o).await?),
            Workload::StatefulSet(o) => Workload::StatefulSet(self.api().create(&pp, o).await?),
            Workload::DaemonSet(o) => Workload::DaemonSet(self.api().create(&pp, o).await?),
            Workload::Job(o) => Workload::Job(self.api().create(&pp, o).await?),
            Workload::CloneSet(o) => Workload::CloneSet(self.api().create(&pp, o).await?),
        })
    }

    /// Create the Ray head Service and the claims of `objects` (already made dependents of
    /// the workload). One that exists already is left as it is.
    pub async fn create_dependents(&self, objects: &MemberObjects) -> Result<(), kube::Error> {
        let pp = PostParams::default();
        if let Some(service) = &objects.head_service {
            match self.api::<Service>().create(&pp, service).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        for claim in &objects.claims {
            match self.api::<PersistentVolumeClaim>().create(&pp, claim).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(secret) = objects.token_secret.as_ref().filter(|s| s.data.is_some()) {
            let api = self.api::<Secret>();
            match api.create(&pp, secret).await {
                Ok(_) => {}
                // One left by the run before (its owner gone, the collector not done yet),
                // or ours from a pass that failed after it: this run's data and owner.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let name = secret.metadata.name.clone().unwrap_or_default();
                    let patch = json!({
                        "metadata": {
                            "labels": secret.metadata.labels,
                            "annotations": secret.metadata.annotations,
                            "ownerReferences": secret.metadata.owner_references,
                        },
                        "data": secret.data,
                    });
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether the token Secret `name` exists with a token in it.
    pub async fn token_secret_filled(&self, name: &str) -> Result<bool, kube::Error> {
        let secret = self.api::<Secret>().get_opt(name).await?;
        Ok(secret
            .and_then(|s| s.data)
            .is_some_and(|d| d.contains_key(crate::kubernetes::env::TOKEN_KEY)))
    }

    /// Replace the spec of the stored `current` with `desired`'s and set `annotations`
    /// (a Job's template is immutable: only `suspend` and `parallelism` change there).
    pub async fn update_workload(
        &self,
        current: &Workload,
        desired: &Workload,
        annotations: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        let name = current.metadata().name.clone().unwrap_or_default();
        let pp = PostParams::default();
        match (current, desired) {
            (Workload::Job(_), Workload::Job(d)) => {
                let spec = d.spec.clone().unwrap_or_default();
                let patch = json!({
                    "metadata": {"annotations": annotations},
                    "spec": {"suspend": spec.suspend, "parallelism": spec.parallelism},
                });
                self.api::<Job>()
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            (Workload::Deployment(c), Workload::Deployment(d)) => {
                let mut next = c.clone();
                next.spec = d.spec.clone();
                merge_annotations(&mut next.metadata, annotations);
                self.api::<Deployment>().replace(&name, &pp, &next).await?;
            }
            (Workload::StatefulSet(c), Workload::StatefulSet(d)) => {
                let mut next = c.clone();
                next.spec = d.spec.clone();
                merge_annotations(&mut next.metadata, annotations);
                self.api::<StatefulSet>().replace(&name, &pp, &next).await?;
            }
            (Workload::DaemonSet(c), Workload::DaemonSet(d)) => {
                let mut next = c.clone();
                next.spec = d.spec.clone();
                merge_annotations(&mut next.metadata, annotations);
                self.api::<DaemonSet>().replace(&name, &pp, &next).await?;
            }
            (Workload::CloneSet(c), Workload::CloneSet(d)) => {
                let mut next = c.clone();
                next.spec = d.spec.clone();
                merge_annotations(&mut next.metadata, annotations);
                self.api::<CloneSet>().replace(&name, &pp, &next).await?;
            }
            // Another kind under the same Task: the reconciler deletes and recreates.
            _ => {}
        }
        Ok(())
    }

    /// Delete `workload` (that very object: UID precondition) with background
    /// propagation, so its Pods, ReplicaSets, Service and claims follow. Gone already is
    /// fine.
    pub async fn delete_workload(&self, workload: &Workload) -> Result<(), kube::Error> {
        let meta = workload.metadata();
        let name = meta.name.clone().unwrap_or_default();
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: meta.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let result = match workload {
            Workload::Deployment(_) => self
                .api::<Deployment>()
                .delete(&name, &params)
                .await
                .map(|_| ()),
            Workload::StatefulSet(_) => self
                .api::<StatefulSet>()
                .delete(&name, &params)
                .await
                .map(|_| ()),
            Workload::DaemonSet(_) => self
                .api::<DaemonSet>()
                .delete(&name, &params)
                .await
                .map(|_| ()),
            Workload::Job(_) => self.api::<Job>().delete(&name, &params).await.map(|_| ()),
            Workload::CloneSet(_) => self
                .api::<CloneSet>()
                .delete(&name, &params)
                .await
                .map(|_| ()),
        };
        match result {
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            other => other,
        }
    }
}

fn merge_annotations(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    annotations: &serde_json::Value,
) {
    if let Some(map) = annotations.as_object() {
        let target = meta.annotations.get_or_insert_with(Default::default);
        for (k, v) in map {
            if let Some(v) = v.as_str() {
                target.insert(k.clone(), v.to_string());
            }
        }
    }
}
