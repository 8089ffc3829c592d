//! One SSH connection: russh's [`Handler`], which authenticates ([`super::auth`]), opens
//! session channels ([`super::session`]), `-L` forwards ([`super::forward`]) and a
//! `domain` certificate's pod-network forwards ([`super::domain`]), refuses
//! everything else (remote forwards, agent and X11 forwarding), and closes the connection
//! when its credential is revoked ([`watch_revocation`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rlark_apiserver::audit::AuditEntry;
use russh::keys::ssh_key::Certificate;
use russh::server::{
    Auth, ChannelOpenHandle, Handler, Msg, PublicKeyOffer, Session, VerifiedPublicKey,
};
use russh::{Channel, ChannelId, Disconnect};

use super::SshState;
use super::auth::{self, Login, Refusal, Target};
use super::limits::{ChannelKind, ChannelSlot, ConnectionChannels};
use super::session::Closing;

/// One client connection.
pub(crate) struct Connection {
    state: Arc<SshState>,
    peer: Option<SocketAddr>,
    login: Option<Arc<Login>>,
    closing: Closing,
    /// Set once authenticated (the connection's authentication deadline reads it).
    authenticated: Arc<AtomicBool>,
    /// Its open channels, for the per-connection caps.
    channels: Arc<ConnectionChannels>,
}

impl Connection {
    pub(crate) fn new(
        state: Arc<SshState>,
        peer: Option<SocketAddr>,
        authenticated: Arc<AtomicBool>,
    ) -> Connection {
        Connection {
            state,
            peer,
            login: None,
            closing: Closing::new(),
            authenticated,
            channels: Arc::default(),
        }
    }

    /// A slot for a new channel of `kind`, or `None` after refusing it with a message
    /// naming the limit (counted and logged).
    async fn channel_slot(
        &self,
        login: &Login,
        kind: ChannelKind,
        reply: ChannelOpenHandle,
    ) -> Option<(ChannelSlot, ChannelOpenHandle)> {
        match super::limits::take_channel(
            &self.state.limits,
            &self.state.user_channels,
            &self.channels,
            &login.identity.user,
            kind,
        ) {
            Ok(slot) => Some((slot, reply)),
            Err(refusal) => {
                self.state.metrics.refused(refusal.limit);
                tracing::info!(
                    user = %login.identity.user,
                    peer = ?self.peer,
                    limit = refusal.limit,
                    reason = %refusal.message,
                    "ssh channel refused: limit reached"
                );
                reply
                    .reject(russh::ChannelOpenFailure::Other {
                        // RFC 4254 SSH_OPEN_RESOURCE_SHORTAGE
                        code: 4,
                        reason: format!("rlark: {}; close some and retry", refusal.message),
                    })
                    .await;
                None
            }
        }
    }

    fn accept(&mut self, login: Login) -> Auth {
        let (resource, namespace, name) = match (&login.target, &login.task) {
            (Target::Domain { domain, .. }, _) => {
                ("domains.rlinf.io/ssh", String::new(), domain.clone())
            }
            (_, Some(task)) => {
                let (namespace, name) = crate::task_access::namespace_and_name(task);
                ("tasks.rlinf.io/ssh", namespace, name)
            }
            (_, None) => ("tasks.rlinf.io/ssh", String::new(), "menu".to_string()),
        };
        let entry = AuditEntry {
            verb: "ssh-login".into(),
            resource: resource.into(),
            namespace,
            name,
            reason: format!(
                "{} from {}",
                login.credential.describe(),
                self.peer.map(|p| p.to_string()).unwrap_or_default()
            ),
            ..AuditEntry::now("ssh-login", "allowed").by(Some(&login.identity))
        };
        self.state.audit.record(entry);
        self.login = Some(Arc::new(login));
        Auth::Accept
    }

    fn refuse(&self, login: &str, refusal: Refusal) -> Auth {
        tracing::info!(
            login,
            user = ?refusal.identity.as_ref().map(|i| &i.user),
            peer = ?self.peer,
            reason = %refusal.reason,
            "ssh login refused"
        );
        self.state.audit.record(AuditEntry {
            verb: "ssh-login".into(),
            resource: "tasks.rlinf.io/ssh".into(),
            name: login.into(),
            reason: format!(
                "{} (from {})",
                refusal.reason,
                self.peer.map(|p| p.to_string()).unwrap_or_default()
            ),
            ..AuditEntry::now("denied", "denied").by(refusal.identity.as_ref())
        });
        Auth::reject()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The connection is gone: stop its revocation watch and anything still running.
        self.closing.close("the connection ended".into());
    }
}

impl Handler for Connection {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        _user: &str,
        _offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        // Decided once the key is proven (`auth_publickey`), so a refusal is audited once.
        Ok(Auth::Accept)
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(
            match auth::by_key(&self.state, user, key.public_key).await {
                Ok(login) => self.accept(login),
                Err(refusal) => self.refuse(user, refusal),
            },
        )
    }

    async fn auth_openssh_certificate(
        &mut self,
        user: &str,
        certificate: &Certificate,
    ) -> Result<Auth, Self::Error> {
        Ok(
            match auth::by_certificate(&self.state, user, certificate).await {
                Ok(login) => self.accept(login),
                Err(refusal) => self.refuse(user, refusal),
            },
        )
    }

    async fn auth_succeeded(&mut self, session: &mut Session) -> Result<(), Self::Error> {
        self.authenticated.store(true, Ordering::Release);
        if let Some(login) = &self.login {
            tokio::spawn(watch_revocation(
                Arc::clone(&self.state),
                Arc::clone(login),
                session.handle(),
                self.closing.clone(),
            ));
        }
        Ok(())
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(login) = self.login.clone() else {
            return Ok(());
        };
        if let Target::Domain { domain, .. } = &login.target {
            reply
                .reject(russh::ChannelOpenFailure::Other {
                    code: 1,
                    reason: format!(
                        "rlark: a domain certificate carries forwards into domain {domain} \
                         only (ssh -N -L ...), not sessions"
                    ),
                })
                .await;
            return Ok(());
        }
        let Some((slot, reply)) = self.channel_slot(&login, ChannelKind::Session, reply).await
        else {
            return Ok(());
        };
        reply.accept().await;
        let run = super::session::run(
            Arc::clone(&self.state),
            login,
            channel,
            self.closing.clone(),
        );
        tokio::spawn(async move {
            let _slot = slot;
            run.await;
        });
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        originator_address: &str,
        originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(login) = self.login.clone() else {
            return Ok(());
        };
        let Some((slot, reply)) = self.channel_slot(&login, ChannelKind::Forward, reply).await
        else {
            return Ok(());
        };
        if matches!(login.target, Target::Domain { .. }) {
            let open = super::domain::open(
                Arc::clone(&self.state),
                login,
                channel,
                super::domain::Flow {
                    host: host_to_connect.to_string(),
                    port: port_to_connect,
                    originator: originator_address.to_string(),
                    originator_port,
                },
                reply,
                self.closing.clone(),
            );
            tokio::spawn(async move {
                let _slot = slot;
                open.await;
            });
            return Ok(());
        }
        let open = super::forward::open(
            Arc::clone(&self.state),
            login,
            channel,
            host_to_connect.to_string(),
            port_to_connect,
            reply,
            self.closing.clone(),
        );
        tokio::spawn(async move {
            let _slot = slot;
            open.await;
        });
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _col_width: u32,
        _row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name == "sftp" {
            session.channel_success(channel)
        } else {
            session.channel_failure(channel)
        }
    }
}

/// Close the connection within moments of its credential being revoked (a certificate,
/// the credential a key was registered with, a removed key, a Task's `sshPublicKey` edited
/// away or its Task deleted), or of the server stopping.
async fn watch_revocation(
    state: Arc<SshState>,
    login: Arc<Login>,
    handle: russh::server::Handle,
    closing: Closing,
) {
    let mut revocations = state.security.subscribe();
    let mut keys = state.keys.subscribe();
    // A login with a Task's `sshPublicKey` also follows that Task: editing the key away (or
    // deleting the Task) closes the connection.
    let mut task_namespace = match &login.credential {
        auth::Credential::TaskKey { namespace, .. } => Some(namespace.clone()),
        _ => None,
    };
    let mut task_events = None;
    let reason = loop {
        if let Some(namespace) = &task_namespace
            && task_events.is_none()
        {
            let from = state.store.revision();
            match state
                .store
                .watch(crate::task_access::TASKS, Some(namespace), from)
                .await
            {
                Ok(events) => task_events = Some(events),
                Err(error) => {
                    tracing::warn!(%error, "ssh: cannot follow the task of a task-key login");
                    task_namespace = None;
                }
            }
            // Whatever happened before this watch began is checked once now.
            if let Some(reason) = auth::revoked(&state, &login.credential).await {
                break reason;
            }
        }
        let task_event = async {
            match task_events.as_mut() {
                Some(events) => futures::StreamExt::next(events).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = revocations.changed() => if changed.is_err() { return },
            changed = keys.changed() => if changed.is_err() { return },
            event = task_event => match event {
                Some(Ok(_)) => {}
                // Ended or fell behind: watch again from the present (after a check).
                _ => task_events = None,
            },
            () = closing.token.cancelled() => return,
            () = state.shutdown.cancelled() => break "the server is shutting down".to_string(),
        }
        if let Some(reason) = auth::revoked(&state, &login.credential).await {
            break reason;
        }
    };
    tracing::info!(user = %login.identity.user, %reason, "closing ssh connection");
    state.audit.record(AuditEntry {
        verb: "ssh-close".into(),
        resource: "tasks.rlinf.io/ssh".into(),
        reason: reason.clone(),
        ..AuditEntry::now("ssh-close", "allowed").by(Some(&login.identity))
    });
    closing.close(reason.clone());
    let _ = handle
        .disconnect(
            Disconnect::ByApplication,
            format!("rlark: {reason}"),
            String::new(),
        )
        .await;
}
