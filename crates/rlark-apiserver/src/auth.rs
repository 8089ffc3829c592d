//! Who is calling. The transport layer (`rlark-server`) resolves credentials (mTLS client
//! certificates, bearer tokens) to an [`Identity`] and inserts it as a request extension;
//! requests without one get 401. This module also fixes the naming conventions of the
//! built-in roles, so that the certificate issuer, the token minter and the authorizer
//! agree on them.
//!
//! | role | user | groups |
//! |---|---|---|
//! | admin | any (e.g. `admin`) | [`ADMIN_GROUP`] |
//! | agent of cluster `C` | `system:rlark:agent:C` | [`AGENT_GROUP`] |
//! | server replica `P` | `system:rlark:peer:P` | [`PEER_GROUP`] |
//! | viewer | any | [`VIEWER_GROUP`] |
//! | task `NS/NAME` (bearer token) | `system:rlark:task:NS:NAME` | [`TASK_GROUP`] |

/// An authenticated caller, following Kubernetes conventions (certificate CN = user, O = groups).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

/// The group that grants every permission (like Kubernetes' `system:masters`).
pub const ADMIN_GROUP: &str = "system:masters";
/// The group of agent certificates.
pub const AGENT_GROUP: &str = "rlark:agents";
/// The group of server-replica certificates.
pub const PEER_GROUP: &str = "rlark:peers";
/// The group of read-only users.
pub const VIEWER_GROUP: &str = "rlark:viewers";
/// The group of task-scoped bearer tokens.
pub const TASK_GROUP: &str = "rlark:tasks";

/// User-name prefix of agents: `system:rlark:agent:<clusterID>`.
pub const AGENT_USER_PREFIX: &str = "system:rlark:agent:";
/// User-name prefix of server replicas: `system:rlark:peer:<name>`.
pub const PEER_USER_PREFIX: &str = "system:rlark:peer:";
/// User-name prefix of task tokens: `system:rlark:task:<namespace>:<name>`.
pub const TASK_USER_PREFIX: &str = "system:rlark:task:";
/// Every user name starting with this is reserved for the built-in roles above; a
/// certificate or token for a human user may not use it.
pub const SYSTEM_USER_PREFIX: &str = "system:";

/// The control-plane namespace an agent of `cluster_id` owns: `rlark-<clusterID>`.
pub fn agent_namespace(cluster_id: &str) -> String {
    format!("rlark-{cluster_id}")
}

/// The built-in role an identity acts in. Resolved from the groups (and, for agents and
/// tasks, the user name, which carries the scope). An identity that claims the agent or task
/// group with a malformed user name is [`Role::Other`]: it gets nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Agent {
        cluster_id: String,
    },
    Peer {
        name: String,
    },
    Viewer,
    Task {
        namespace: String,
        name: String,
    },
    /// Authenticated, but no built-in role: discovery only.
    Other,
}

impl Identity {
    /// Identity of the agent of `cluster_id`.
    pub fn agent(cluster_id: &str) -> Self {
        Self {
            user: format!("{AGENT_USER_PREFIX}{cluster_id}"),
            groups: vec![AGENT_GROUP.to_string()],
        }
    }

    /// Identity of server replica `name`.
    pub fn peer(name: &str) -> Self {
        Self {
            user: format!("{PEER_USER_PREFIX}{name}"),
            groups: vec![PEER_GROUP.to_string()],
        }
    }

    /// Identity of the token of task `namespace/name`.
    pub fn task(namespace: &str, name: &str) -> Self {
        Self {
            user: format!("{TASK_USER_PREFIX}{namespace}:{name}"),
            groups: vec![TASK_GROUP.to_string()],
        }
    }

    fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// The role this identity acts in. Admin wins over everything else; an agent or task
    /// identity is only recognised with its user-name convention.
    pub fn role(&self) -> Role {
        if self.in_group(ADMIN_GROUP) {
            return Role::Admin;
        }
        if self.in_group(AGENT_GROUP) {
            return match self.user.strip_prefix(AGENT_USER_PREFIX) {
                Some(id) if !id.is_empty() && !id.contains(':') => Role::Agent {
                    cluster_id: id.to_string(),
                },
                _ => Role::Other,
            };
        }
        if self.in_group(TASK_GROUP) {
            let scope = self.user.strip_prefix(TASK_USER_PREFIX);
            return match scope.and_then(|s| s.split_once(':')) {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(':') => {
                    Role::Task {
                        namespace: ns.to_string(),
                        name: name.to_string(),
                    }
                }
                _ => Role::Other,
            };
        }
        if self.in_group(PEER_GROUP) {
            return match self.user.strip_prefix(PEER_USER_PREFIX) {
                Some(name) if !name.is_empty() => Role::Peer {
                    name: name.to_string(),
                },
                _ => Role::Other,
            };
        }
        if self.in_group(VIEWER_GROUP) {
            return Role::Viewer;
        }
        Role::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_naming_conventions() {
        assert_eq!(
            Identity::agent("edge-1").role(),
            Role::Agent {
                cluster_id: "edge-1".into()
            }
        );
        assert_eq!(
            Identity::task("ns", "t").role(),
            Role::Task {
                namespace: "ns".into(),
                name: "t".into()
            }
        );
        assert_eq!(Identity::peer("p").role(), Role::Peer { name: "p".into() });
        let viewer = Identity {
            user: "alice".into(),
            groups: vec![VIEWER_GROUP.into()],
        };
        assert_eq!(viewer.role(), Role::Viewer);
        let admin = Identity {
            user: "root".into(),
            groups: vec![VIEWER_GROUP.into(), ADMIN_GROUP.into()],
        };
        assert_eq!(admin.role(), Role::Admin);
        // Claiming a scoped group without the user convention grants nothing.
        let forged = Identity {
            user: "mallory".into(),
            groups: vec![AGENT_GROUP.into()],
        };
        assert_eq!(forged.role(), Role::Other);
        let forged_task = Identity {
            user: "system:rlark:task:ns".into(),
            groups: vec![TASK_GROUP.into()],
        };
        assert_eq!(forged_task.role(), Role::Other);
        assert_eq!(agent_namespace("c1"), "rlark-c1");
    }
}
