//! The login `menu`: RLark's jumper, limited to what the user may reach. It lists the
//! running replicas of the tasks the user may reach ([`task_access::reachable_tasks`]);
//! with a terminal (`ssh -t menu@...`, or a plain interactive `ssh menu@...`) the user
//! types a number and gets a shell there; without one (`ssh menu@... list`, any command)
//! the list is printed and the session ends with status 0.

use std::sync::Arc;

use bytes::Bytes;
use russh::ChannelMsg;
use russh::server::Msg;
use russh::{ChannelReadHalf, ChannelWriteHalf};

use super::SshState;
use super::auth::Login;
use crate::task_access::{self, Replica};

/// Longest line the menu reads.
const MAX_LINE: usize = 16;
/// Most replicas listed.
const MAX_ENTRIES: usize = 1000;

/// List the reachable replicas; with a terminal, read a choice: the replica and what the
/// user typed after the choice's line (input for the shell). `Ok(None)` when the session
/// ended here (list printed, quit); `Err` says why the list could not be made.
pub(super) async fn choose(
    state: &SshState,
    login: &Login,
    read: &mut ChannelReadHalf,
    write: &ChannelWriteHalf<Msg>,
    tty: bool,
) -> Result<Option<(Replica, Vec<u8>)>, String> {
    let tasks = task_access::reachable_tasks(&*state.store, &login.identity)
        .await
        .map_err(|e| e.to_string())?;
    let mut entries: Vec<Replica> = Vec::new();
    for (namespace, name, replicas) in tasks {
        let Ok(task) = task_access::find_task(&*state.store, &name, Some(&namespace)).await else {
            continue;
        };
        for index in 0..replicas.min(MAX_ENTRIES as u64) {
            let Ok(index) = u32::try_from(index) else {
                break;
            };
            if let Ok(replica) =
                task_access::running_replica(&*state.store, Arc::clone(&task), index).await
            {
                entries.push(replica);
            }
            if entries.len() >= MAX_ENTRIES {
                break;
            }
        }
    }
    let newline = if tty { "\r\n" } else { "\n" };
    let mut text = format!(
        "Running replicas {} may reach:{newline}",
        login.identity.user
    );
    if entries.is_empty() {
        text.push_str(&format!("  (none){newline}"));
    }
    for (i, replica) in entries.iter().enumerate() {
        text.push_str(&format!(
            "  {:>3}) {}/{} (ssh {}.{}.{}@...){newline}",
            i + 1,
            replica.namespace,
            replica.pod_name,
            replica.task_name,
            replica.index,
            replica.namespace
        ));
    }
    if !tty || entries.is_empty() {
        let _ = write.data_bytes(Bytes::from(text)).await;
        let _ = write.exit_status(0).await;
        let _ = write.eof().await;
        let _ = write.close().await;
        return Ok(None);
    }
    text.push_str("Number (q to quit): ");
    let _ = write.data_bytes(Bytes::from(text)).await;
    let mut line = String::new();
    loop {
        let data = match read.wait().await {
            Some(ChannelMsg::Data { data }) => data,
            Some(ChannelMsg::Eof) | None => return Ok(None),
            Some(_) => continue,
        };
        for (at, byte) in data.iter().copied().enumerate() {
            match byte {
                b'\r' | b'\n' => {
                    let _ = write.data_bytes(Bytes::from_static(b"\r\n")).await;
                    let choice = line.trim().to_string();
                    if choice == "q" {
                        let _ = write.exit_status(0).await;
                        let _ = write.eof().await;
                        let _ = write.close().await;
                        return Ok(None);
                    }
                    match choice.parse::<usize>() {
                        Ok(n) if (1..=entries.len()).contains(&n) => {
                            let rest = data.get(at + 1..).unwrap_or_default();
                            // A CR LF line end: the LF belongs to this line.
                            let rest = rest.strip_prefix(b"\n").unwrap_or(rest);
                            return Ok(Some((entries.swap_remove(n - 1), rest.to_vec())));
                        }
                        _ => {
                            line.clear();
                            let _ = write
                                .data_bytes(Bytes::from(format!(
                                    "Type a number from 1 to {}, or q: ",
                                    entries.len()
                                )))
                                .await;
                        }
                    }
                }
                // ^C, ^D
                3 | 4 => {
                    let _ = write.exit_status(130).await;
                    let _ = write.close().await;
                    return Ok(None);
                }
                // Backspace, DEL
                8 | 127 if line.pop().is_some() => {
                    let _ = write.data_bytes(Bytes::from_static(b"\x08 \x08")).await;
                }
                b if b.is_ascii_graphic() && line.len() < MAX_LINE => {
                    line.push(char::from(b));
                    let _ = write.data_bytes(Bytes::from(vec![b])).await;
                }
                _ => {}
            }
        }
    }
}
