//! Pure: the device authorization rule of [`super`] (module documentation there).

use super::{Caller, Holders, ReplicaHolder};

/// Where a caller stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing<'a> {
    /// It belongs to this replica.
    Replica(&'a ReplicaHolder),
    /// Outside every replica, uid 0 or the runtime's own.
    Admin,
    /// Anyone else.
    Outsider,
}

/// What to do with one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refuse, with this message.
    Deny(String),
    /// A replica is starting and the caller may be it: ask again once the agent has
    /// published it; refuse with this message when it does not come.
    Wait(String),
}

/// The devices a list call shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visible {
    All,
    /// These device IDs.
    Only(Vec<String>),
}

impl Visible {
    /// Whether device `id` is shown.
    pub fn shows(&self, id: &str) -> bool {
        match self {
            Visible::All => true,
            Visible::Only(ids) => ids.iter().any(|d| d == id),
        }
    }
}

/// Where `caller` stands: the replica it belongs to (a root of it is its session leader or
/// one of its ancestors, or its uid is the replica's own), else admin when its uid is in
/// `admin_uids`, else outsider.
pub fn standing<'a>(holders: &'a Holders, caller: &Caller, admin_uids: &[u32]) -> Standing<'a> {
    let rooted = holders.replicas.iter().find(|r| {
        r.roots.iter().any(|root| {
            caller.session.as_ref() == Some(root) || caller.lineage.iter().any(|p| p == root)
        })
    });
    let by_uid = || {
        caller
            .uid
            .and_then(|uid| holders.replicas.iter().find(|r| r.uids.contains(&uid)))
    };
    match rooted.or_else(by_uid) {
        Some(replica) => Standing::Replica(replica),
        None if caller.uid.is_some_and(|uid| admin_uids.contains(&uid)) => Standing::Admin,
        None => Standing::Outsider,
    }
}

/// The decision on a call for `device` (a Node device ID) by `caller`.
pub fn decide(holders: &Holders, device: &str, caller: &Caller, admin_uids: &[u32]) -> Decision {
    let holder = holders
        .replicas
        .iter()
        .find(|r| r.devices.iter().any(|d| d == device));
    let held = match holder {
        Some(h) => format!("{device} is held by replica {}", h.name),
        None => format!("{device} is held by no replica"),
    };
    let who = match (caller.pid, caller.uid) {
        (Some(pid), Some(uid)) => format!("process {pid} (uid {uid})"),
        (Some(pid), None) => format!("process {pid}"),
        (None, Some(uid)) => format!("a process of uid {uid}"),
        (None, None) => "an unidentified process".to_string(),
    };
    match standing(holders, caller, admin_uids) {
        Standing::Replica(replica) if replica.devices.iter().any(|d| d == device) => {
            Decision::Allow
        }
        Standing::Replica(replica) => {
            let own = if replica.devices.is_empty() {
                "none".to_string()
            } else {
                replica.devices.join(", ")
            };
            Decision::Deny(format!(
                "{held}; the caller, {who} of replica {}, may call only the devices its replica holds ({own})",
                replica.name
            ))
        }
        Standing::Admin => Decision::Allow,
        Standing::Outsider => {
            let message = format!(
                "{held}; the caller, {who}, belongs to no replica of this host and is not root: \
                 only the holding replica and root may call it"
            );
            if holders.replicas.iter().any(|r| r.starting) {
                Decision::Wait(message)
            } else {
                Decision::Deny(message)
            }
        }
    }
}

/// What a list call shows `caller`: everything to an admin, its replica's devices to a
/// replica, nothing to anyone else.
pub fn visible(holders: &Holders, caller: &Caller, admin_uids: &[u32]) -> Visible {
    match standing(holders, caller, admin_uids) {
        Standing::Admin => Visible::All,
        Standing::Replica(replica) => Visible::Only(replica.devices.clone()),
        Standing::Outsider => Visible::Only(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::ProcessRef;
    use super::*;

    const ADMINS: &[u32] = &[0];

    fn p(pid: i32, start_ticks: u64) -> ProcessRef {
        ProcessRef { pid, start_ticks }
    }

    /// Replica a (supervisor 100 started at 1000) holds arm-0; b (200 at 2000) holds arm-1;
    /// c (300 at 3000) holds nothing.
    fn lab() -> Holders {
        let replica = |name: &str, root: ProcessRef, devices: &[&str]| ReplicaHolder {
            name: name.into(),
            roots: vec![root],
            devices: devices.iter().map(|d| (*d).to_string()).collect(),
            ..ReplicaHolder::default()
        };
        Holders {
            replicas: vec![
                replica("ns/a", p(100, 1000), &["robot-arm-0"]),
                replica("ns/b", p(200, 2000), &["robot-arm-1", "camera-cam-0"]),
                replica("ns/c", p(300, 3000), &[]),
            ],
        }
    }

    /// A process `pid` of uid `uid` in the session of `session`, below `ancestors`.
    fn caller(pid: i32, uid: u32, session: Option<ProcessRef>, ancestors: &[ProcessRef]) -> Caller {
        let mut lineage = vec![p(pid, 5)];
        lineage.extend_from_slice(ancestors);
        lineage.push(p(1, 1));
        Caller {
            pid: Some(pid),
            uid: Some(uid),
            lineage,
            session,
        }
    }

    #[test]
    fn a_replica_may_call_what_it_holds_and_nothing_else() {
        let holders = lab();
        // In a's session (root, as raw replicas run today).
        let in_a = caller(150, 0, Some(p(100, 1000)), &[p(100, 1000)]);
        assert_eq!(
            decide(&holders, "robot-arm-0", &in_a, ADMINS),
            Decision::Allow
        );
        let Decision::Deny(message) = decide(&holders, "robot-arm-1", &in_a, ADMINS) else {
            panic!("a holds arm-0 only");
        };
        assert!(
            message.contains("robot-arm-1 is held by replica ns/b")
                && message.contains("process 150 (uid 0) of replica ns/a")
                && message.contains("(robot-arm-0)"),
            "{message}"
        );
        // Root does not make a replica's process an admin; holding nothing gives nothing.
        let in_c = caller(350, 0, Some(p(300, 3000)), &[p(300, 3000)]);
        assert!(matches!(
            decide(&holders, "robot-arm-0", &in_c, ADMINS),
            Decision::Deny(m) if m.contains("(none)")
        ));
        assert_eq!(
            decide(
                &holders,
                "robot-arm-1",
                &caller(250, 1000, Some(p(200, 2000)), &[]),
                ADMINS
            ),
            Decision::Allow,
            "b's own uid need not be root"
        );
    }

    #[test]
    fn a_replicas_own_user_is_the_replica_outside_its_session_too() {
        let mut holders = lab();
        holders.replicas[1].uids = vec![2_000_000_007];
        // An exec or SSH session the agent started beside b, as b's user.
        let shell = caller(900, 2_000_000_007, Some(p(900, 5)), &[p(50, 5)]);
        assert_eq!(
            decide(&holders, "robot-arm-1", &shell, ADMINS),
            Decision::Allow
        );
        assert!(matches!(
            decide(&holders, "robot-arm-0", &shell, ADMINS),
            Decision::Deny(m) if m.contains("of replica ns/b")
        ));
    }

    #[test]
    fn leaving_the_session_does_not_leave_the_replica() {
        let holders = lab();
        // a's process called setsid(): its own session, but a's supervisor is an ancestor.
        let escaped = caller(160, 0, Some(p(160, 5)), &[p(150, 4), p(100, 1000)]);
        assert_eq!(
            standing(&holders, &escaped, ADMINS),
            Standing::Replica(&holders.replicas[0])
        );
        assert!(matches!(
            decide(&holders, "robot-arm-1", &escaped, ADMINS),
            Decision::Deny(_)
        ));
        // A session leader whose pid was reused (another start time) is not a's.
        let reused = caller(170, 0, Some(p(100, 9999)), &[p(100, 9999)]);
        assert_eq!(standing(&holders, &reused, ADMINS), Standing::Admin);
    }

    #[test]
    fn root_outside_replicas_may_call_anything_and_others_nothing() {
        let holders = lab();
        let agent = caller(50, 0, Some(p(50, 5)), &[]);
        assert_eq!(
            decide(&holders, "robot-arm-1", &agent, ADMINS),
            Decision::Allow
        );
        assert_eq!(
            decide(&holders, "robot-arm-9", &agent, ADMINS),
            Decision::Allow
        );
        assert_eq!(visible(&holders, &agent, ADMINS), Visible::All);
        let user = caller(60, 1000, Some(p(60, 5)), &[]);
        let Decision::Deny(message) = decide(&holders, "robot-arm-1", &user, ADMINS) else {
            panic!("not root, not a replica");
        };
        assert!(
            message.contains("process 60 (uid 1000), belongs to no replica"),
            "{message}"
        );
        assert!(matches!(
            decide(&holders, "robot-arm-9", &user, ADMINS),
            Decision::Deny(m) if m.contains("robot-arm-9 is held by no replica")
        ));
        assert_eq!(visible(&holders, &user, ADMINS), Visible::Only(Vec::new()));
        // The runtime's own user counts as an admin.
        assert_eq!(
            decide(&holders, "robot-arm-1", &user, &[0, 1000]),
            Decision::Allow
        );
        // An unidentified caller (no credentials) is nobody's.
        assert!(matches!(
            decide(&holders, "robot-arm-0", &Caller::default(), ADMINS),
            Decision::Deny(m) if m.contains("an unidentified process")
        ));
    }

    #[test]
    fn an_outsider_waits_while_a_replica_starts() {
        let mut holders = lab();
        holders.replicas.push(ReplicaHolder {
            name: "ns/d".into(),
            starting: true,
            devices: vec!["robot-arm-2".into()],
            ..ReplicaHolder::default()
        });
        let newcomer = caller(400, 1000, Some(p(390, 7)), &[p(390, 7)]);
        assert!(matches!(
            decide(&holders, "robot-arm-2", &newcomer, ADMINS),
            Decision::Wait(m) if m.contains("held by replica ns/d")
        ));
        // Published: d's supervisor is 390.
        holders.replicas[3].roots = vec![p(390, 7)];
        holders.replicas[3].starting = false;
        assert_eq!(
            decide(&holders, "robot-arm-2", &newcomer, ADMINS),
            Decision::Allow
        );
        assert_eq!(
            visible(&holders, &newcomer, ADMINS),
            Visible::Only(vec!["robot-arm-2".into()])
        );
    }
}
