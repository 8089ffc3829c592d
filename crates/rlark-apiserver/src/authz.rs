//! Built-in authorization: which [`Identity`] may do what to which resource (DESIGN §5).
//! A pure policy over Kubernetes-style request [`Attributes`]; no IO. The API server asks
//! it once per resource request, after the URL is parsed and before the body is read or the
//! store is touched, and turns a [`Decision::Deny`] into a `403 Forbidden` `Status`.
//!
//! | role | may |
//! |---|---|
//! | admin | everything |
//! | agent of cluster `C` (namespace `rlark-C`) | every verb on `nodes`, `tasks`, `pods` (`rlinf.io`, and their `status`) and `leases` (`coordination.k8s.io`) in `rlark-C`; read `domainpeers` in `rlark-C` and patch/update their `status`; create/get/list/watch/patch/update core `events` in `rlark-C`; get the Namespace `rlark-C` |
//! | peer, viewer | get/list/watch every resource except the secret-like ones |
//! | task `NS/NAME` | get its own Task `NS/NAME` (and its `status`); create core `events` in `NS` (admission further requires the Event to be about that Task) |
//! | anyone else | nothing |
//!
//! Discovery (`/api`, `/apis/...`, `/openapi/...`, `/version`) is not a resource request:
//! every authenticated identity may read it (Kubernetes' `system:discovery`).

use crate::auth::{Identity, Role, agent_namespace};
use crate::request::{Target, Verb};

/// rlark's own API group.
const RLINF_GROUP: &str = "rlinf.io";
/// The group of Leases.
const COORDINATION_GROUP: &str = "coordination.k8s.io";
/// The core group.
const CORE_GROUP: &str = "";

/// The read verbs.
const READ_VERBS: &[&str] = &["get", "list", "watch"];
/// Every verb the API server serves.
const ALL_VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];
/// What an agent may do with the Events of its namespace (no deletes: Events expire).
const AGENT_EVENT_VERBS: &[&str] = &["create", "get", "list", "watch", "patch", "update"];

/// `(group, resource)` pairs that read-everything roles (viewer, peer) may still not read,
/// so that credentials stay hidden if such resources are ever served.
const SECRET_LIKE: &[(&str, &str)] = &[(CORE_GROUP, "secrets")];

/// What a resource request asks to do, as Kubernetes' authorizer attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: String,
    /// API group; empty for the core group.
    pub group: String,
    /// The resource's plural, without subresource.
    pub resource: String,
    /// `status` for the status subresource.
    pub subresource: Option<String>,
    /// The namespace of the request; `None` for cluster-scoped resources and for
    /// all-namespaces lists and watches. As in Kubernetes, a request for one Namespace
    /// object carries that Namespace's name here too.
    pub namespace: Option<String>,
    /// Object name; `None` for collection requests.
    pub name: Option<String>,
}

impl Attributes {
    /// The resource as the deny reason names it: `tasks` or `tasks/status`.
    fn resource_path(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }

    /// `plural.group` (`jobs.rlinf.io`), or `plural` for the core group.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn is_read(&self) -> bool {
        READ_VERBS.contains(&self.verb.as_str())
    }

    fn verb_in(&self, verbs: &[&str]) -> bool {
        verbs.contains(&self.verb.as_str())
    }

    /// No subresource, or `status`.
    fn main_or_status(&self) -> bool {
        matches!(self.subresource.as_deref(), None | Some("status"))
    }

    fn in_namespace(&self, namespace: &str) -> bool {
        self.namespace.as_deref() == Some(namespace)
    }

    fn is_secret_like(&self) -> bool {
        SECRET_LIKE
            .iter()
            .any(|(group, resource)| self.group == *group && self.resource == *resource)
    }
}

/// The attributes of a parsed resource request. A request for one Namespace object
/// (`/api/v1/namespaces/{name}`) gets that name as its namespace, as in Kubernetes.
pub(crate) fn resource_attributes(target: &Target, verb: Verb) -> Attributes {
    let rt = &target.rt;
    let is_namespace_object = rt.group.is_empty() && rt.plural == "namespaces";
    let namespace = match (&target.namespace, &target.name) {
        (Some(namespace), _) => Some(namespace.clone()),
        (None, Some(name)) if is_namespace_object => Some(name.clone()),
        (None, _) => None,
    };
    Attributes {
        verb: verb.as_str().to_string(),
        group: rt.group.clone(),
        resource: rt.plural.clone(),
        subresource: match (target.status, target.subresource) {
            (true, _) => Some("status".to_string()),
            (false, Some(sub)) => Some(sub.as_str().to_string()),
            (false, None) => None,
        },
        namespace,
        name: target.name.clone(),
    }
}

/// The answer for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied; the reason is worded as Kubernetes' authorizer words it (see [`authorize`]).
    Deny(String),
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow)
    }
}

/// Decide whether `identity` may make the request described by `attrs`, per the role table
/// in the module documentation. A denial's reason is kube-apiserver's wording:
/// `User "alice" cannot create resource "jobs" in API group "rlinf.io" in the namespace
/// "default"` (`at the cluster scope` without a namespace; `resource "tasks/status"` for a
/// subresource).
pub fn authorize(identity: &Identity, attrs: &Attributes) -> Decision {
    if permits(&identity.role(), attrs) {
        Decision::Allow
    } else {
        Decision::Deny(deny_reason(&identity.user, attrs))
    }
}

fn permits(role: &Role, attrs: &Attributes) -> bool {
    match role {
        Role::Admin => true,
        Role::Agent { cluster_id } => agent_permits(&agent_namespace(cluster_id), attrs),
        Role::Peer { .. } | Role::Viewer => attrs.is_read() && !attrs.is_secret_like(),
        Role::Task { namespace, name } => task_permits(namespace, name, attrs),
        Role::Other => false,
    }
}

/// An agent owning namespace `own`: its namespace only, and only the kinds it runs.
fn agent_permits(own: &str, attrs: &Attributes) -> bool {
    if !attrs.in_namespace(own) {
        return false;
    }
    match (attrs.group.as_str(), attrs.resource.as_str()) {
        (RLINF_GROUP, "nodes" | "tasks" | "pods") => {
            attrs.main_or_status() && attrs.verb_in(ALL_VERBS)
        }
        // The Domain controller writes a DomainPeer's spec (who the namespace may reach);
        // the agent only reads it and reports the paths its members took in `status`.
        (RLINF_GROUP, "domainpeers") => match attrs.subresource.as_deref() {
            None => attrs.is_read(),
            Some("status") => attrs.is_read() || attrs.verb_in(&["patch", "update"]),
            Some(_) => false,
        },
        (COORDINATION_GROUP, "leases") => attrs.subresource.is_none() && attrs.verb_in(ALL_VERBS),
        (CORE_GROUP, "events") => attrs.subresource.is_none() && attrs.verb_in(AGENT_EVENT_VERBS),
        (CORE_GROUP, "namespaces") => {
            attrs.subresource.is_none() && attrs.verb == "get" && attrs.name.as_deref() == Some(own)
        }
        _ => false,
    }
}

/// The token of task `namespace/name`: read that Task, post Events in its namespace.
fn task_permits(namespace: &str, name: &str, attrs: &Attributes) -> bool {
    if !attrs.in_namespace(namespace) {
        return false;
    }
    match (attrs.group.as_str(), attrs.resource.as_str()) {
        (RLINF_GROUP, "tasks") => {
            attrs.main_or_status() && attrs.verb == "get" && attrs.name.as_deref() == Some(name)
        }
        (CORE_GROUP, "events") => attrs.subresource.is_none() && attrs.verb == "create",
        _ => false,
    }
}

/// Kubernetes' `forbiddenMessage` for a resource request.
fn deny_reason(user: &str, attrs: &Attributes) -> String {
    let scope = match attrs.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        Some(namespace) => format!("in the namespace {namespace:?}"),
        None => "at the cluster scope".to_string(),
    };
    format!(
        "User {user:?} cannot {} resource {:?} in API group {:?} {scope}",
        attrs.verb,
        attrs.resource_path(),
        attrs.group
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{ADMIN_GROUP, VIEWER_GROUP};

    fn admin() -> Identity {
        Identity {
            user: "root".into(),
            groups: vec![ADMIN_GROUP.into()],
        }
    }

    fn viewer() -> Identity {
        Identity {
            user: "alice".into(),
            groups: vec![VIEWER_GROUP.into()],
        }
    }

    fn other() -> Identity {
        Identity {
            user: "bob".into(),
            groups: vec!["developers".into()],
        }
    }

    /// Attributes from a compact request description: `verb`, `group/resource[/sub]`
    /// (core group: `resource[/sub]` with a leading `/`), namespace (`""` = none), name
    /// (`""` = none). Namespace objects carry their name as namespace, as
    /// [`resource_attributes`] builds them.
    fn req(verb: &str, resource: &str, namespace: &str, name: &str) -> Attributes {
        let (group, rest) = resource.split_once('/').unwrap_or((resource, ""));
        let (resource, subresource) = match rest.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (rest, None),
        };
        let none_if_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let mut namespace = none_if_empty(namespace);
        if group.is_empty() && resource == "namespaces" && !name.is_empty() {
            namespace = Some(name.to_string());
        }
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource,
            namespace,
            name: none_if_empty(name),
        }
    }

    const JOBS: &str = "rlinf.io/jobs";
    const WORKFLOWS: &str = "rlinf.io/workflows";
    const DOMAINS: &str = "rlinf.io/domains";
    const TASKS: &str = "rlinf.io/tasks";
    const TASK_STATUS: &str = "rlinf.io/tasks/status";
    const NODES: &str = "rlinf.io/nodes";
    const NODE_STATUS: &str = "rlinf.io/nodes/status";
    const PODS: &str = "rlinf.io/pods";
    const DOMAINPEERS: &str = "rlinf.io/domainpeers";
    const DOMAINPEER_STATUS: &str = "rlinf.io/domainpeers/status";
    const LEASES: &str = "coordination.k8s.io/leases";
    const EVENTS: &str = "/events";
    const NAMESPACES: &str = "/namespaces";
    const SECRETS: &str = "/secrets";

    const A: &str = "rlark-a";
    const B: &str = "rlark-b";
    const DEFAULT: &str = "default";
    const CLUSTER: &str = "";

    /// Who in the matrix: admin, agent A, agent B, viewer, peer, task rlark-a/t1, other.
    const WHO: [&str; 7] = [
        "admin", "agentA", "agentB", "viewer", "peer", "task", "other",
    ];

    fn identities() -> [Identity; 7] {
        [
            admin(),
            Identity::agent("a"),
            Identity::agent("b"),
            viewer(),
            Identity::peer("p1"),
            Identity::task(A, "t1"),
            other(),
        ]
    }

    /// The authorization matrix: request, then allow (`Y`) or deny (`.`) for
    /// admin, agent A, agent B, viewer, peer, task `rlark-a/t1`, other.
    #[rustfmt::skip]
    const MATRIX: &[(&str, &str, &str, &str, &str)] = &[
        // verb, resource, namespace, name, expected
        // Cluster-scoped rlark kinds: admin writes, readers read, nobody else.
        ("get",              JOBS,        CLUSTER, "j1", "Y..YY.."),
        ("list",             JOBS,        CLUSTER, "",   "Y..YY.."),
        ("watch",            JOBS,        CLUSTER, "",   "Y..YY.."),
        ("create",           JOBS,        CLUSTER, "",   "Y......"),
        ("update",           JOBS,        CLUSTER, "j1", "Y......"),
        ("patch",            JOBS,        CLUSTER, "j1", "Y......"),
        ("delete",           JOBS,        CLUSTER, "j1", "Y......"),
        ("deletecollection", JOBS,        CLUSTER, "",   "Y......"),
        ("get",              WORKFLOWS,   CLUSTER, "w1", "Y..YY.."),
        ("create",           WORKFLOWS,   CLUSTER, "",   "Y......"),
        ("patch",            WORKFLOWS,   CLUSTER, "w1", "Y......"),
        ("get",              DOMAINS,     CLUSTER, "d1", "Y..YY.."),
        ("list",             DOMAINS,     CLUSTER, "",   "Y..YY.."),
        ("create",           DOMAINS,     CLUSTER, "",   "Y......"),
        ("update",           DOMAINS,     CLUSTER, "d1", "Y......"),
        ("delete",           DOMAINS,     CLUSTER, "d1", "Y......"),
        // Tasks: the owning agent does everything in its namespace; the task token reads
        // only itself.
        ("get",              TASKS,       A,       "t1", "YY.YYY."),
        ("get",              TASKS,       A,       "t2", "YY.YY.."),
        ("list",             TASKS,       A,       "",   "YY.YY.."),
        ("watch",            TASKS,       A,       "",   "YY.YY.."),
        ("watch",            TASKS,       A,       "t1", "YY.YY.."),
        ("create",           TASKS,       A,       "",   "YY....."),
        ("update",           TASKS,       A,       "t1", "YY....."),
        ("patch",            TASKS,       A,       "t1", "YY....."),
        ("delete",           TASKS,       A,       "t1", "YY....."),
        ("deletecollection", TASKS,       A,       "",   "YY....."),
        ("get",              TASK_STATUS, A,       "t1", "YY.YYY."),
        ("get",              TASK_STATUS, A,       "t2", "YY.YY.."),
        ("update",           TASK_STATUS, A,       "t1", "YY....."),
        ("patch",            TASK_STATUS, A,       "t1", "YY....."),
        ("get",              TASKS,       B,       "t1", "Y.YYY.."),
        ("create",           TASKS,       B,       "",   "Y.Y...."),
        ("patch",            TASK_STATUS, B,       "t1", "Y.Y...."),
        ("get",              TASKS,       DEFAULT, "t1", "Y..YY.."),
        ("create",           TASKS,       DEFAULT, "",   "Y......"),
        // All-namespaces list/watch: no agent may.
        ("list",             TASKS,       CLUSTER, "",   "Y..YY.."),
        ("watch",            TASKS,       CLUSTER, "",   "Y..YY.."),
        // Nodes and Pods.
        ("get",              NODES,       A,       "n1", "YY.YY.."),
        ("list",             NODES,       A,       "",   "YY.YY.."),
        ("create",           NODES,       A,       "",   "YY....."),
        ("update",           NODE_STATUS, A,       "n1", "YY....."),
        ("delete",           NODES,       A,       "n1", "YY....."),
        ("create",           NODES,       B,       "",   "Y.Y...."),
        ("list",             NODES,       CLUSTER, "",   "Y..YY.."),
        ("create",           PODS,        A,       "",   "YY....."),
        ("patch",            PODS,        A,       "p1", "YY....."),
        ("delete",           PODS,        B,       "p1", "Y.Y...."),
        ("watch",            PODS,        CLUSTER, "",   "Y..YY.."),
        // DomainPeers: agents read their own and write only their status.
        ("get",              DOMAINPEERS, A,       "dp", "YY.YY.."),
        ("list",             DOMAINPEERS, A,       "",   "YY.YY.."),
        ("watch",            DOMAINPEERS, A,       "",   "YY.YY.."),
        ("create",           DOMAINPEERS, A,       "",   "Y......"),
        ("update",           DOMAINPEERS, A,       "dp", "Y......"),
        ("delete",           DOMAINPEERS, A,       "dp", "Y......"),
        ("list",             DOMAINPEERS, B,       "",   "Y.YYY.."),
        ("list",             DOMAINPEERS, CLUSTER, "",   "Y..YY.."),
        ("patch",            DOMAINPEERS, A,       "dp", "Y......"),
        ("get",              DOMAINPEER_STATUS, A, "dp", "YY.YY.."),
        ("patch",            DOMAINPEER_STATUS, A, "dp", "YY....."),
        ("update",           DOMAINPEER_STATUS, A, "dp", "YY....."),
        ("delete",           DOMAINPEER_STATUS, A, "dp", "Y......"),
        ("patch",            DOMAINPEER_STATUS, B, "dp", "Y.Y...."),
        // Leases: the agent's heartbeat.
        ("get",              LEASES,      A,       "hb", "YY.YY.."),
        ("create",           LEASES,      A,       "",   "YY....."),
        ("update",           LEASES,      A,       "hb", "YY....."),
        ("delete",           LEASES,      A,       "hb", "YY....."),
        ("update",           LEASES,      B,       "hb", "Y.Y...."),
        ("create",           LEASES,      DEFAULT, "",   "Y......"),
        ("list",             LEASES,      CLUSTER, "",   "Y..YY.."),
        // Events: agents record in their namespace, task tokens may post there.
        ("create",           EVENTS,      A,       "",   "YY...Y."),
        ("get",              EVENTS,      A,       "e1", "YY.YY.."),
        ("list",             EVENTS,      A,       "",   "YY.YY.."),
        ("patch",            EVENTS,      A,       "e1", "YY....."),
        ("update",           EVENTS,      A,       "e1", "YY....."),
        ("delete",           EVENTS,      A,       "e1", "Y......"),
        ("deletecollection", EVENTS,      A,       "",   "Y......"),
        ("create",           EVENTS,      B,       "",   "Y.Y...."),
        ("create",           EVENTS,      DEFAULT, "",   "Y......"),
        ("list",             EVENTS,      CLUSTER, "",   "Y..YY.."),
        // Namespaces: an agent may look at its own.
        ("get",              NAMESPACES,  CLUSTER, A,    "YY.YY.."),
        ("get",              NAMESPACES,  CLUSTER, B,    "Y.YYY.."),
        ("get",              NAMESPACES,  CLUSTER, DEFAULT, "Y..YY.."),
        ("list",             NAMESPACES,  CLUSTER, "",   "Y..YY.."),
        ("watch",            NAMESPACES,  CLUSTER, "",   "Y..YY.."),
        ("create",           NAMESPACES,  CLUSTER, "",   "Y......"),
        ("update",           NAMESPACES,  CLUSTER, A,    "Y......"),
        ("delete",           NAMESPACES,  CLUSTER, A,    "Y......"),
        // Secret-like resources stay hidden from readers.
        ("get",              SECRETS,     A,       "s",  "Y......"),
        ("list",             SECRETS,     CLUSTER, "",   "Y......"),
        // Verbs outside the served set are the admin's only.
        ("escalate",         TASKS,       A,       "t1", "Y......"),
    ];

    #[test]
    fn authorization_matrix() {
        let identities = identities();
        let mut failures = Vec::new();
        for (verb, resource, namespace, name, expected) in MATRIX {
            assert_eq!(expected.len(), identities.len(), "row {verb} {resource}");
            let attrs = req(verb, resource, namespace, name);
            for ((identity, who), want) in identities.iter().zip(WHO).zip(expected.chars()) {
                let allowed = authorize(identity, &attrs).is_allowed();
                if allowed != (want == 'Y') {
                    failures.push(format!(
                        "{who}: {verb} {resource} ns={namespace:?} name={name:?}: got {}, want {}",
                        if allowed { "allow" } else { "deny" },
                        if want == 'Y' { "allow" } else { "deny" },
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn agents_are_confined_to_their_own_namespace() {
        let resources = [
            JOBS,
            WORKFLOWS,
            DOMAINS,
            TASKS,
            TASK_STATUS,
            NODES,
            NODE_STATUS,
            PODS,
            DOMAINPEERS,
            DOMAINPEER_STATUS,
            LEASES,
            EVENTS,
            NAMESPACES,
            SECRETS,
        ];
        for (agent, foreign) in [(Identity::agent("a"), B), (Identity::agent("b"), A)] {
            for verb in ALL_VERBS {
                for resource in resources {
                    for name in ["", "x", foreign] {
                        let attrs = req(verb, resource, foreign, name);
                        assert!(
                            !authorize(&agent, &attrs).is_allowed(),
                            "{} may {verb} {resource} {name:?} in {foreign}",
                            agent.user
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn malformed_role_claims_get_nothing() {
        let forged_agent = Identity {
            user: "mallory".into(),
            groups: vec![crate::auth::AGENT_GROUP.into()],
        };
        for attrs in [
            req("get", TASKS, A, "t1"),
            req("list", JOBS, CLUSTER, ""),
            req("create", EVENTS, A, ""),
        ] {
            assert!(!authorize(&forged_agent, &attrs).is_allowed(), "{attrs:?}");
            assert!(!authorize(&other(), &attrs).is_allowed(), "{attrs:?}");
        }
    }

    #[test]
    fn deny_reasons_are_worded_as_kubernetes_words_them() {
        assert_eq!(
            authorize(&viewer(), &req("create", TASKS, DEFAULT, "")),
            Decision::Deny(
                r#"User "alice" cannot create resource "tasks" in API group "rlinf.io" in the namespace "default""#
                    .into()
            )
        );
        assert_eq!(
            authorize(&viewer(), &req("delete", JOBS, CLUSTER, "j1")),
            Decision::Deny(
                r#"User "alice" cannot delete resource "jobs" in API group "rlinf.io" at the cluster scope"#
                    .into()
            )
        );
        assert_eq!(
            authorize(&Identity::agent("a"), &req("patch", TASK_STATUS, B, "t1")),
            Decision::Deny(
                r#"User "system:rlark:agent:a" cannot patch resource "tasks/status" in API group "rlinf.io" in the namespace "rlark-b""#
                    .into()
            )
        );
        assert_eq!(
            authorize(&other(), &req("get", NAMESPACES, CLUSTER, "default")),
            Decision::Deny(
                r#"User "bob" cannot get resource "namespaces" in API group "" in the namespace "default""#
                    .into()
            )
        );
        assert_eq!(
            authorize(&admin(), &req("delete", JOBS, CLUSTER, "j1")),
            Decision::Allow
        );
    }

    #[test]
    fn attributes_of_parsed_requests() {
        let registry = crate::registry::Registry::builtin();
        let target = |path: &str| crate::request::parse_path(&registry, path).expect(path);
        let attrs = resource_attributes(
            &target("/apis/rlinf.io/v1alpha1/namespaces/rlark-a/tasks/t1/status"),
            Verb::Patch,
        );
        assert_eq!(attrs, req("patch", TASK_STATUS, A, "t1"));
        assert_eq!(attrs.qualified_resource(), "tasks.rlinf.io");
        let attrs = resource_attributes(&target("/api/v1/namespaces/rlark-a"), Verb::Get);
        assert_eq!(attrs, req("get", NAMESPACES, A, A));
        assert_eq!(attrs.qualified_resource(), "namespaces");
        let attrs = resource_attributes(&target("/apis/rlinf.io/v1alpha1/pods"), Verb::List);
        assert_eq!(attrs, req("list", PODS, CLUSTER, ""));
        let attrs = resource_attributes(&target("/api/v1/namespaces"), Verb::Create);
        assert_eq!(attrs, req("create", NAMESPACES, CLUSTER, ""));
    }
}
