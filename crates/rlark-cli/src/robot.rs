//! `rlark robot`: talk to the robot controllers of `rlark embodied` on this host through
//! their unix sockets (`ros-ctrl.sock` for ROS 1 and simulated robots, `ros2-ctrl.sock` for
//! ROS 2 robots). A robot is looked up on each socket present in `--socket-dir`.
//!
//! `start` sends `rlark-detach: true`: the CLI exits right away, so the robot must not be
//! tied to its process by the safety watchdog (docs/embodied.md). Stop it with
//! `rlark robot stop`. Inside a replica holding devices (`RLINF_EMBODIED_OWNER` set by the
//! agent) it sends `rlark-owner` instead, so the robot belongs to the replica and stops
//! when the replica ends; `--detach` opts out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use rlark_embodied::robot::state_name;
use rlark_proto::client::Ownership;
use rlark_proto::robot::v1 as pb;
use rlark_proto::robot::v1::RobotState;
use rlark_proto::robot::v1::robot_controller_client::RobotControllerClient;
use rlark_proto::sockets::{ROS_SOCKET, ROS2_SOCKET};
use tonic::transport::Channel;

use super::output::{DataFormat, print_data};
use super::table::align;

#[derive(Debug, Args)]
pub(crate) struct RobotArgs {
    /// Directory of the embodied runtime's sockets.
    #[arg(long, value_name = "DIR", default_value = rlark_proto::sockets::DEFAULT_SOCKET_DIR, global = true)]
    pub socket_dir: PathBuf,
    #[command(subcommand)]
    pub command: RobotCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RobotCommand {
    /// List the robots with their state, mode and owner.
    List {
        /// Print them as a `RobotList` document (`items`) in JSON or YAML instead of a table.
        #[arg(short = 'o', long, value_enum)]
        output: Option<DataFormat>,
    },
    /// Show one robot (with the joint state of a simulated arm).
    Status {
        id: String,
        /// Print it in JSON or YAML (an item of `robot list -o json|yaml`) instead of a
        /// table.
        #[arg(short = 'o', long, value_enum)]
        output: Option<DataFormat>,
    },
    /// Start a robot in a mode (default: its type's default mode). Not tied to this
    /// process: stop it with `rlark robot stop`. Inside a replica holding devices
    /// (`RLINF_EMBODIED_OWNER` set) the replica owns it: it stops when the replica ends.
    Start {
        id: String,
        /// Preset mode of the robot's type.
        #[arg(long)]
        mode: Option<String>,
        /// Extra launch argument. Repeatable.
        #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = parse_pair)]
        args: Vec<(String, String)>,
        /// Start it detached even inside a replica: no owner, no safety watchdog.
        #[arg(long)]
        detach: bool,
    },
    /// Stop a robot (and its ROS master).
    Stop { id: String },
    /// Switch a running robot to another mode.
    Switch {
        id: String,
        mode: String,
        /// Extra launch argument. Repeatable.
        #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = parse_pair)]
        args: Vec<(String, String)>,
    },
    /// Reset a robot: stop everything and clear an ERROR.
    Reset { id: String },
    /// Print a robot's recent output.
    Logs {
        id: String,
        /// Only the last N lines (0 = all that are kept).
        #[arg(long, default_value_t = 0)]
        tail: u32,
    },
}

/// Who owns a robot `rlark robot start` starts: nobody with `--detach` or outside a
/// replica (the CLI exits at once), the replica in `RLINF_EMBODIED_OWNER` inside one.
fn start_ownership(detach: bool) -> Ownership {
    if detach {
        Ownership::Detached
    } else {
        Ownership::from_env_or(Ownership::Detached)
    }
}

fn parse_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} must be NAME=VALUE")),
    }
}

type Client = RobotControllerClient<Channel>;

/// The RobotController sockets present in `dir`.
fn sockets(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let found: Vec<PathBuf> = [ROS_SOCKET, ROS2_SOCKET]
        .iter()
        .map(|name| dir.join(name))
        .filter(|path| path.exists())
        .collect();
    if found.is_empty() {
        bail!(
            "no robot controller socket in {} (is `rlark embodied` running? --socket-dir)",
            dir.display()
        );
    }
    Ok(found)
}

async fn client(socket: &Path) -> anyhow::Result<Client> {
    Ok(RobotControllerClient::new(
        rlark_proto::client::connect(socket).await?,
    ))
}

/// A gRPC error as the user should read it.
fn rpc_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

/// The client of the socket that serves robot `id`.
async fn client_for(dir: &Path, id: &str) -> anyhow::Result<Client> {
    let mut last = None;
    for socket in sockets(dir)? {
        let mut client = client(&socket).await?;
        match client
            .get_robot_status(pb::GetRobotStatusRequest {
                robot_id: id.into(),
            })
            .await
        {
            Ok(_) => return Ok(client),
            Err(status) if status.code() == tonic::Code::NotFound => last = Some(status),
            Err(status) => return Err(rpc_error(status)),
        }
    }
    Err(match last {
        Some(_) => anyhow::anyhow!("robot {id:?} not found in {}", dir.display()),
        None => anyhow::anyhow!("robot {id:?} not found"),
    })
}

fn state(value: i32) -> &'static str {
    state_name(RobotState::try_from(value).unwrap_or(RobotState::Unspecified))
}

fn ros_column(info: &pb::RobotInfo) -> String {
    match info.backend.as_str() {
        "ros1" => info.ros_master_uri.clone(),
        "ros2" => format!("domain {}", info.ros_domain_id),
        _ => String::new(),
    }
}

fn owner_column(info: &pb::RobotInfo) -> String {
    match info.owner_pid {
        0 => String::new(),
        pid => pid.to_string(),
    }
}

const LIST_HEADER: [&str; 7] = ["ID", "TYPE", "BACKEND", "STATE", "MODE", "OWNER", "ROS"];

fn list_row(info: &pb::RobotInfo) -> Vec<String> {
    vec![
        info.robot_id.clone(),
        info.robot_type.clone(),
        info.backend.clone(),
        state(info.state).to_string(),
        info.mode.clone(),
        owner_column(info),
        ros_column(info),
    ]
}

/// A robot as `robot list -o json|yaml` prints it: the list columns' fields by name, with
/// the state as its name and a sim arm's joint positions.
fn robot_json(info: &pb::RobotInfo) -> serde_json::Value {
    let mut robot = serde_json::json!({
        "id": info.robot_id,
        "type": info.robot_type,
        "backend": info.backend,
        "state": state(info.state),
        "mode": info.mode,
        "ownerPid": info.owner_pid,
        "rosMasterUri": info.ros_master_uri,
        "rosDomainId": info.ros_domain_id,
        "params": info.params,
        "message": info.message,
    });
    if let Some(sim) = &info.sim {
        robot["joints"] = serde_json::json!(sim.positions);
    }
    robot
}

fn header(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// `rlark robot status`: the list columns plus the message and a sim arm's joints.
fn status_table(info: &pb::RobotInfo) -> String {
    let mut head = header(&LIST_HEADER);
    let mut row = list_row(info);
    if let Some(sim) = &info.sim {
        let joints: Vec<String> = sim.positions.iter().map(|p| format!("{p:.3}")).collect();
        head.push("JOINTS".into());
        row.push(joints.join(","));
    }
    head.push("MESSAGE".into());
    row.push(info.message.clone());
    align(&[head, row])
}

fn info_from_status(s: pb::GetRobotStatusResponse) -> pb::RobotInfo {
    pb::RobotInfo {
        robot_id: s.robot_id,
        mode: s.mode,
        state: s.state,
        current_mode: s.current_mode,
        ros_master_uri: s.ros_master_uri,
        params: s.params,
        ros_domain_id: s.ros_domain_id,
        message: s.message,
        backend: s.backend,
        robot_type: s.robot_type,
        owner_pid: s.owner_pid,
        sim: s.sim,
    }
}

fn mode_config(args: Vec<(String, String)>) -> Option<pb::ModeConfig> {
    (!args.is_empty()).then(|| pb::ModeConfig {
        args: args.into_iter().collect::<BTreeMap<_, _>>(),
        ..Default::default()
    })
}

pub(crate) async fn robot(args: RobotArgs) -> anyhow::Result<()> {
    let dir = args.socket_dir;
    match args.command {
        RobotCommand::List { output } => {
            let mut lines = vec![header(&LIST_HEADER)];
            let mut items = Vec::new();
            for socket in sockets(&dir)? {
                let robots = client(&socket)
                    .await?
                    .list_robots(pb::ListRobotsRequest {})
                    .await
                    .map_err(rpc_error)
                    .with_context(|| format!("list robots on {}", socket.display()))?
                    .into_inner()
                    .robots;
                lines.extend(robots.iter().map(list_row));
                items.extend(robots.iter().map(robot_json));
            }
            match output {
                Some(format) => print_data(
                    &serde_json::json!({"kind": "RobotList", "items": items}),
                    format,
                )?,
                None => print!("{}", align(&lines)),
            }
        }
        RobotCommand::Status { id, output } => {
            let status = client_for(&dir, &id)
                .await?
                .get_robot_status(pb::GetRobotStatusRequest { robot_id: id })
                .await
                .map_err(rpc_error)?
                .into_inner();
            let info = info_from_status(status);
            match output {
                Some(format) => print_data(&robot_json(&info), format)?,
                None => print!("{}", status_table(&info)),
            }
        }
        RobotCommand::Start {
            id,
            mode,
            args,
            detach,
        } => {
            let mut request = tonic::Request::new(pb::StartRobotRequest {
                robot_id: id.clone(),
                mode: mode.unwrap_or_default(),
                mode_config: mode_config(args),
            });
            start_ownership(detach).apply(&mut request);
            let started = client_for(&dir, &id)
                .await?
                .start_robot(request)
                .await
                .map_err(rpc_error)?
                .into_inner();
            let mode = started.current_mode.map(|m| m.name).unwrap_or_default();
            println!("robot/{id} started ({}, mode {mode})", state(started.state));
        }
        RobotCommand::Stop { id } => {
            let stopped = client_for(&dir, &id)
                .await?
                .stop_robot(pb::StopRobotRequest {
                    robot_id: id.clone(),
                })
                .await
                .map_err(rpc_error)?
                .into_inner();
            println!("robot/{id} stopped ({})", state(stopped.state));
        }
        RobotCommand::Switch { id, mode, args } => {
            let switched = client_for(&dir, &id)
                .await?
                .switch_mode(pb::SwitchModeRequest {
                    robot_id: id.clone(),
                    mode,
                    mode_config: mode_config(args),
                })
                .await
                .map_err(rpc_error)?
                .into_inner();
            println!(
                "robot/{id} switched to mode {} ({})",
                switched.mode,
                state(switched.state)
            );
        }
        RobotCommand::Reset { id } => {
            let reset = client_for(&dir, &id)
                .await?
                .reset_robot(pb::ResetRobotRequest {
                    robot_id: id.clone(),
                })
                .await
                .map_err(rpc_error)?
                .into_inner();
            println!("robot/{id} reset ({})", state(reset.state));
        }
        RobotCommand::Logs { id, tail } => {
            let logs = client_for(&dir, &id)
                .await?
                .get_robot_logs(pb::GetRobotLogsRequest {
                    robot_id: id,
                    tail: i32::try_from(tail).unwrap_or(i32::MAX),
                })
                .await
                .map_err(rpc_error)?
                .into_inner();
            for line in logs.lines {
                println!("{line}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use super::*;
    use clap::Parser as _;

    fn parse(args: &[&str]) -> Result<RobotArgs, clap::Error> {
        let cli = Cli::try_parse_from(["rlark", "robot"].iter().chain(args))?;
        match cli.command {
            Command::Robot(args) => Ok(args),
            other => panic!("not robot: {other:?}"),
        }
    }

    #[test]
    fn parses_robot_commands() {
        let args = parse(&[
            "--socket-dir",
            "/tmp/s",
            "start",
            "arm-0",
            "--mode",
            "teleop",
            "--arg",
            "target=1,2",
        ])
        .expect("parse");
        assert_eq!(args.socket_dir, PathBuf::from("/tmp/s"));
        let RobotCommand::Start {
            id,
            mode,
            args,
            detach,
        } = args.command
        else {
            panic!("not start")
        };
        assert_eq!((id.as_str(), mode.as_deref()), ("arm-0", Some("teleop")));
        assert!(!detach);
        assert_eq!(args, [("target".to_string(), "1,2".to_string())]);

        let args =
            parse(&["switch", "arm-0", "idle", "--socket-dir", "d"]).expect("global flag after");
        assert_eq!(args.socket_dir, PathBuf::from("d"));
        assert!(matches!(args.command, RobotCommand::Switch { ref mode, .. } if mode == "idle"));
        let args = parse(&["list"]).expect("default dir");
        assert_eq!(args.socket_dir, PathBuf::from("/var/run/rlark"));
        assert!(parse(&["start"]).is_err());
        assert!(parse(&["start", "a", "--arg", "novalue"]).is_err());
        assert!(parse(&["logs", "a", "--tail", "-1"]).is_err());
    }

    #[test]
    fn status_shows_joints_and_message() {
        let info = pb::RobotInfo {
            robot_id: "arm-0".into(),
            robot_type: "sim-arm".into(),
            backend: "sim".into(),
            state: RobotState::Error as i32,
            mode: "teleop".into(),
            owner_pid: 42,
            message: "simulated arm fault: x".into(),
            sim: Some(pb::SimArmState {
                positions: vec![0.5, -1.0],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            status_table(&info),
            "ID        TYPE      BACKEND   STATE     MODE      OWNER     ROS       JOINTS         MESSAGE\n\
             arm-0     sim-arm   sim       ERROR     teleop    42                  0.500,-1.000   simulated arm fault: x\n"
        );
    }
}
