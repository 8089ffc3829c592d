//! What one client may hold on the SSH endpoint (the `ssh` section of the config file;
//! docs/ssh.md, "Limits"):
//!
//! - **Connections**, admitted by the HTTPS listener's gate ([`crate::limits::Gate`]): a
//!   general budget ([`SshLimits::max_connections`], at most
//!   [`SshLimits::max_connections_per_ip`] from one source address) and beyond it a reserve
//!   ([`SshLimits::reserved_connections`], [`SshLimits::reserved_connections_per_ip`] per
//!   source), so a crowd of silent connections from a few addresses does not lock the
//!   others out. A connection fitting neither is closed at once.
//! - **Login deadline**: a connection that has not authenticated within
//!   [`SshLimits::login_deadline`] of being accepted is disconnected, the version exchange
//!   included; a silent connection holds its slot that long at most.
//! - **Channels**: sessions (shell, command, sftp) and forwards (`direct-tcpip`) an
//!   authenticated connection may hold open at once ([`SshLimits::max_sessions_per_connection`],
//!   [`SshLimits::max_channels_per_connection`], forwards and sessions together), and one user
//!   over all their connections ([`SshLimits::max_sessions_per_user`],
//!   [`SshLimits::max_channels_per_user`]). A channel over a limit is refused with an
//!   open-failure message naming the limit.
//!
//! Every refusal is counted in `rlark_ssh_refused_total{limit}` and logged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::limits::{GateCaps, MAX_DURATION};

/// The SSH endpoint's limits (config file section `ssh`). See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshLimits {
    /// Open connections in the general budget, all sources together (default 1024). File
    /// field `ssh.maxConnections`.
    pub max_connections: usize,
    /// Open connections in the general budget from one source IP (default 64). File field
    /// `ssh.maxConnectionsPerIP`.
    pub max_connections_per_ip: usize,
    /// Reserve slots beyond the general budget (default 32; 0 disables the reserve). File
    /// field `ssh.reservedConnections`.
    pub reserved_connections: usize,
    /// Reserve slots one source IP may hold (default 2, at most `reservedConnections`).
    /// File field `ssh.reservedConnectionsPerIP`.
    pub reserved_connections_per_ip: usize,
    /// A connection must have authenticated within this time of being accepted, or it is
    /// disconnected (default 10 s). File field `ssh.loginDeadlineSeconds`.
    pub login_deadline: Duration,
    /// Session channels (shell, command, sftp) open at once on one connection (default 10,
    /// as OpenSSH's `MaxSessions`). File field `ssh.maxSessionsPerConnection`.
    pub max_sessions_per_connection: usize,
    /// Channels of any kind (sessions and `-L` forwards) open at once on one connection
    /// (default 256). File field `ssh.maxChannelsPerConnection`.
    pub max_channels_per_connection: usize,
    /// Session channels one user holds open at once over all their connections (default
    /// 64). File field `ssh.maxSessionsPerUser`.
    pub max_sessions_per_user: usize,
    /// Channels of any kind one user holds open at once over all their connections
    /// (default 512). File field `ssh.maxChannelsPerUser`.
    pub max_channels_per_user: usize,
}

impl Default for SshLimits {
    /// The defaults documented on each field.
    fn default() -> Self {
        SshLimits {
            max_connections: 1024,
            max_connections_per_ip: 64,
            reserved_connections: 32,
            reserved_connections_per_ip: 2,
            login_deadline: Duration::from_secs(10),
            max_sessions_per_connection: 10,
            max_channels_per_connection: 256,
            max_sessions_per_user: 64,
            max_channels_per_user: 512,
        }
    }
}

impl SshLimits {
    /// The connection gate's caps.
    pub(crate) fn gate_caps(&self) -> GateCaps {
        GateCaps {
            max_connections: self.max_connections,
            max_per_ip: self.max_connections_per_ip,
            reserve: self.reserved_connections,
            reserve_per_ip: self.reserved_connections_per_ip,
        }
    }

    /// Check every field: `Err((field, message))` names the config-file field.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        for (field, value) in [
            ("ssh.maxConnections", self.max_connections),
            ("ssh.maxConnectionsPerIP", self.max_connections_per_ip),
            (
                "ssh.maxSessionsPerConnection",
                self.max_sessions_per_connection,
            ),
            (
                "ssh.maxChannelsPerConnection",
                self.max_channels_per_connection,
            ),
            ("ssh.maxSessionsPerUser", self.max_sessions_per_user),
            ("ssh.maxChannelsPerUser", self.max_channels_per_user),
        ] {
            if value == 0 {
                return Err((field, "must be positive".into()));
            }
        }
        if self.reserved_connections > 0
            && (self.reserved_connections_per_ip == 0
                || self.reserved_connections_per_ip > self.reserved_connections)
        {
            return Err((
                "ssh.reservedConnectionsPerIP",
                format!(
                    "must be between 1 and ssh.reservedConnections ({}), got {}",
                    self.reserved_connections, self.reserved_connections_per_ip
                ),
            ));
        }
        if self.login_deadline.is_zero() || self.login_deadline > MAX_DURATION {
            return Err((
                "ssh.loginDeadlineSeconds",
                format!(
                    "must be between 1 and {} seconds, got {}",
                    MAX_DURATION.as_secs(),
                    self.login_deadline.as_secs()
                ),
            ));
        }
        Ok(())
    }
}

/// Label of `rlark_ssh_refused_total`: the limit that refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabel {
    pub limit: String,
}

/// The SSH endpoint's refusal counter.
#[derive(Clone, Debug, Default)]
pub(crate) struct SshMetrics {
    pub refused: Family<LimitLabel, Counter>,
}

impl SshMetrics {
    /// Register in `registry` (`rlark_ssh_refused_total`).
    pub(crate) fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "rlark_ssh_refused",
            "SSH connections, logins and channels refused by a limit (connections, \
             login-deadline, sessions-per-connection, channels-per-connection, \
             sessions-per-user, channels-per-user, agent-streams-per-user)",
            self.refused.clone(),
        );
    }

    /// Count one refusal by `limit`.
    pub(crate) fn refused(&self, limit: &str) {
        self.refused
            .get_or_create(&LimitLabel {
                limit: limit.to_string(),
            })
            .inc();
    }
}

/// What a channel is, for its caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChannelKind {
    /// A session channel (shell, command, sftp, the menu).
    Session,
    /// A `direct-tcpip` forward.
    Forward,
}

/// Open channels of one connection or one user: (sessions, all channels).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Open {
    sessions: usize,
    channels: usize,
}

impl Open {
    fn add(&mut self, kind: ChannelKind) {
        self.channels += 1;
        if kind == ChannelKind::Session {
            self.sessions += 1;
        }
    }

    fn remove(&mut self, kind: ChannelKind) {
        self.channels = self.channels.saturating_sub(1);
        if kind == ChannelKind::Session {
            self.sessions = self.sessions.saturating_sub(1);
        }
    }
}

/// Open channels per user, over all connections (one per endpoint).
#[derive(Debug, Default)]
pub(crate) struct UserChannels {
    open: Mutex<HashMap<String, Open>>,
}

/// Open channels of one connection.
#[derive(Debug, Default)]
pub(crate) struct ConnectionChannels {
    open: Mutex<Open>,
}

/// Why a channel was refused: the limit's metric label and the message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChannelRefusal {
    pub limit: &'static str,
    pub message: String,
}

/// One open channel's place in its connection's and its user's counts, given back when
/// dropped (when the channel's task ends).
#[derive(Debug)]
pub(crate) struct ChannelSlot {
    kind: ChannelKind,
    user: String,
    users: Arc<UserChannels>,
    connection: Arc<ConnectionChannels>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Take a slot for a channel of `kind` of `user` on `connection`, or say which limit of
/// `limits` refuses it.
pub(crate) fn take_channel(
    limits: &SshLimits,
    users: &Arc<UserChannels>,
    connection: &Arc<ConnectionChannels>,
    user: &str,
    kind: ChannelKind,
) -> Result<ChannelSlot, ChannelRefusal> {
    // Lock order: the connection's, then the users'.
    let mut mine = lock(&connection.open);
    let mut all = lock(&users.open);
    let theirs = all.get(user).copied().unwrap_or_default();
    let session = kind == ChannelKind::Session;
    let refusal = if session && mine.sessions >= limits.max_sessions_per_connection {
        Some((
            "sessions-per-connection",
            format!(
                "this connection has {} sessions open, the most one connection may hold \
                 (ssh.maxSessionsPerConnection)",
                mine.sessions
            ),
        ))
    } else if mine.channels >= limits.max_channels_per_connection {
        Some((
            "channels-per-connection",
            format!(
                "this connection has {} channels (sessions and forwards) open, the most one \
                 connection may hold (ssh.maxChannelsPerConnection)",
                mine.channels
            ),
        ))
    } else if session && theirs.sessions >= limits.max_sessions_per_user {
        Some((
            "sessions-per-user",
            format!(
                "user {user:?} has {} sessions open, the most one user may hold \
                 (ssh.maxSessionsPerUser)",
                theirs.sessions
            ),
        ))
    } else if theirs.channels >= limits.max_channels_per_user {
        Some((
            "channels-per-user",
            format!(
                "user {user:?} has {} channels (sessions and forwards) open, the most one \
                 user may hold (ssh.maxChannelsPerUser)",
                theirs.channels
            ),
        ))
    } else {
        None
    };
    if let Some((limit, message)) = refusal {
        return Err(ChannelRefusal { limit, message });
    }
    mine.add(kind);
    all.entry(user.to_string()).or_default().add(kind);
    Ok(ChannelSlot {
        kind,
        user: user.to_string(),
        users: Arc::clone(users),
        connection: Arc::clone(connection),
    })
}

impl Drop for ChannelSlot {
    fn drop(&mut self) {
        let mut mine = lock(&self.connection.open);
        mine.remove(self.kind);
        let mut all = lock(&self.users.open);
        if let Some(theirs) = all.get_mut(&self.user) {
            theirs.remove(self.kind);
            if *theirs == Open::default() {
                all.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> SshLimits {
        SshLimits {
            max_sessions_per_connection: 2,
            max_channels_per_connection: 3,
            max_sessions_per_user: 3,
            max_channels_per_user: 5,
            ..SshLimits::default()
        }
    }

    #[test]
    fn channels_are_capped_per_connection_and_per_user_and_given_back() {
        let limits = small();
        let users = Arc::new(UserChannels::default());
        let c1 = Arc::new(ConnectionChannels::default());
        let c2 = Arc::new(ConnectionChannels::default());
        let take = |c: &Arc<ConnectionChannels>, user: &str, kind| {
            take_channel(&limits, &users, c, user, kind)
        };
        let s1 = take(&c1, "alice", ChannelKind::Session).expect("first session");
        let _s2 = take(&c1, "alice", ChannelKind::Session).expect("second session");
        let refused = take(&c1, "alice", ChannelKind::Session).expect_err("third");
        assert_eq!(refused.limit, "sessions-per-connection");
        assert!(
            refused.message.contains("ssh.maxSessionsPerConnection"),
            "{refused:?}"
        );
        let _f1 = take(&c1, "alice", ChannelKind::Forward).expect("a forward");
        assert_eq!(
            take(&c1, "alice", ChannelKind::Forward)
                .expect_err("fourth channel")
                .limit,
            "channels-per-connection"
        );
        // Another connection of the same user: the user's caps.
        let _s3 = take(&c2, "alice", ChannelKind::Session).expect("third session of alice");
        assert_eq!(
            take(&c2, "alice", ChannelKind::Session)
                .expect_err("fourth session of alice")
                .limit,
            "sessions-per-user"
        );
        let _f2 = take(&c2, "alice", ChannelKind::Forward).expect("fifth channel");
        let refused = take(&c2, "alice", ChannelKind::Forward).expect_err("sixth channel");
        assert_eq!(refused.limit, "channels-per-user");
        assert!(refused.message.contains("\"alice\""), "{refused:?}");
        // Another user is not affected.
        let _b = take(&c2, "bob", ChannelKind::Forward).expect("bob");
        // A closed channel gives its slot back.
        drop(s1);
        let _again = take(&c1, "alice", ChannelKind::Session).expect("after a close");
    }

    #[test]
    fn counts_are_forgotten_at_zero() {
        let limits = small();
        let users = Arc::new(UserChannels::default());
        let c = Arc::new(ConnectionChannels::default());
        let slot = take_channel(&limits, &users, &c, "u", ChannelKind::Session).expect("slot");
        drop(slot);
        assert!(lock(&users.open).is_empty());
        assert_eq!(*lock(&c.open), Open::default());
    }

    #[test]
    fn validation_names_the_field() {
        assert!(SshLimits::default().validate().is_ok());
        type Change = fn(&mut SshLimits);
        let cases: [(Change, &str); 4] = [
            (|l| l.max_connections = 0, "ssh.maxConnections"),
            (
                |l| l.reserved_connections_per_ip = 100,
                "ssh.reservedConnectionsPerIP",
            ),
            (
                |l| l.login_deadline = Duration::ZERO,
                "ssh.loginDeadlineSeconds",
            ),
            (|l| l.max_channels_per_user = 0, "ssh.maxChannelsPerUser"),
        ];
        for (change, field) in cases {
            let mut l = SshLimits::default();
            change(&mut l);
            assert_eq!(l.validate().expect_err(field).0, field);
        }
    }
}
