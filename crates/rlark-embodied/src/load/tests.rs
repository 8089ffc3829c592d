use super::*;
use crate::config::Encoding;

const SIM: &str = r#"
types:
  - type: sim-arm
    backend: sim
    defaultMode: idle
    modes:
      idle: {package: rlark_sim, launchFile: arm.launch}
      teleop:
        package: rlark_sim
        launch_file: arm.launch
        args: {speed: 1.5}
        argFrom: {joints: dof}
robots:
  - id: arm-0
    type: sim-arm
    params: {dof: 4}
cameras:
  - {id: cam-0, driver: sim, width: 640, height: 480, fps: 30, encoding: jpeg}
watchdog: 500ms
"#;

fn problems(yaml: &str) -> Vec<String> {
    match EmbodiedConfig::from_yaml(yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(ConfigError::Invalid(problems)) => problems.iter().map(ToString::to_string).collect(),
        Err(other) => vec![other.to_string()],
    }
}

fn assert_problem(yaml: &str, expected: &str) {
    let found = problems(yaml);
    assert!(
        found.iter().any(|p| p.contains(expected)),
        "expected a problem containing {expected:?}, got {found:#?}"
    );
}

#[test]
fn parses_a_sim_configuration_with_defaults_and_aliases() {
    let config = EmbodiedConfig::from_yaml(SIM).expect("valid");
    assert_eq!(config.watchdog, Duration::from_millis(500));
    let arm = config.robot("arm-0").expect("arm-0");
    assert_eq!(arm.backend, Backend::Sim);
    assert_eq!(arm.params["dof"], "4", "numbers become strings");
    assert_eq!((arm.master_port, arm.domain_id), (None, None));
    let t = &config.types["sim-arm"];
    assert_eq!(t.default_mode.as_deref(), Some("idle"));
    assert_eq!(
        t.modes["teleop"].launch_file, "arm.launch",
        "snake_case alias"
    );
    assert_eq!(t.modes["teleop"].args["speed"], "1.5");
    assert_eq!(config.cameras[0].encoding, Encoding::Jpeg);
    assert_eq!(config.log_lines, 2000);
    assert_eq!(config.ros.first_master_port, 11311);

    let empty = EmbodiedConfig::from_yaml("").expect("empty file");
    assert!(empty.robots.is_empty());
    assert_eq!(empty.watchdog, DEFAULT_WATCHDOG);
}

#[test]
fn assigns_master_ports_and_domain_ids_around_explicit_ones() {
    let config = EmbodiedConfig::from_yaml(
        r#"
types:
  - {type: franka, backend: ros1, modes: {run: {package: franka_control, launchFile: run.launch}}}
  - {type: ur, backend: ros2, modes: {run: {package: ur_bringup, launchFile: ur.launch.py}}}
robots:
  - {id: a, type: franka}
  - {id: b, type: franka, masterPort: 11311}
  - {id: c, type: franka}
  - {id: d, type: ur, domain_id: 0}
  - {id: e, type: ur}
"#,
    )
    .expect("valid");
    let port = |id| config.robot(id).and_then(|r| r.master_port);
    let domain = |id| config.robot(id).and_then(|r| r.domain_id);
    assert_eq!(
        (port("a"), port("b"), port("c")),
        (Some(11312), Some(11311), Some(11313))
    );
    assert_eq!((domain("d"), domain("e")), (Some(0), Some(1)));
}

#[test]
fn shape_errors_name_the_field_path() {
    let e = EmbodiedConfig::from_yaml("robots:\n  - {id: a, type: t, masterPort: high}\n")
        .expect_err("bad type");
    assert!(e.to_string().starts_with("robots[0].masterPort: "), "{e}");
    let e = EmbodiedConfig::from_yaml("robots:\n  - {id: a, type: t, colour: red}\n")
        .expect_err("unknown field");
    assert!(
        e.to_string().contains("robots[0]") && e.to_string().contains("colour"),
        "{e}"
    );
    let e = EmbodiedConfig::from_yaml("types:\n  - {type: t, backend: ros3}\n").expect_err("enum");
    assert!(e.to_string().starts_with("types[0].backend: "), "{e}");
    let e = EmbodiedConfig::from_yaml("watchdog: soon\n").expect_err("duration");
    assert!(e.to_string().starts_with("watchdog: "), "{e}");
    let e = EmbodiedConfig::from_yaml("robots:\n  - {id: a, type: t, params: {x: [1]}}\n")
        .expect_err("param");
    assert!(e.to_string().starts_with("robots[0].params"), "{e}");
    let e = EmbodiedConfig::from_yaml("robots: [").expect_err("yaml");
    assert!(matches!(e, ConfigError::Yaml(_)), "{e}");
}

#[test]
fn semantic_errors_name_the_field_path_and_are_all_reported() {
    let found = problems(
        r#"
types:
  - {type: t, backend: ros1, modes: {run: {package: p, launchFile: run.launch}}}
robots:
  - {id: a, type: nope}
  - {id: a, type: t, domainId: 3}
allowedLaunchPackages: ["bad name"]
"#,
    );
    for expected in [
        "robots[0].type: unknown robot type \"nope\" (types: t)",
        "robots[1].id: robot \"a\" is defined twice",
        "robots[1].domainId: only ros2 robots have a domain ID",
        "allowedLaunchPackages[0]: ",
    ] {
        assert!(
            found.iter().any(|p| p.starts_with(expected)),
            "{expected:?} not in {found:#?}"
        );
    }
}

#[test]
fn robot_and_mode_rules() {
    let base = "types:\n  - {type: r1, backend: ros1, modes: {run: {package: p, launchFile: run.launch}}}\n";
    assert_problem(
        &format!(
            "{base}robots:\n  - {{id: a, type: r1, masterPort: 1000}}\n  - {{id: b, type: r1, masterPort: 1000}}\n"
        ),
        "robots[1].masterPort: port 1000 is also the master port of robots[0]",
    );
    assert_problem(
        "types:\n  - {type: r2, backend: ros2}\nrobots:\n  - {id: a, type: r2, domainId: 102}\n",
        "robots[0].domainId: 102 is above the largest ROS 2 domain ID, 101",
    );
    assert_problem(
        "types:\n  - {type: r2, backend: ros2}\nrobots:\n  - {id: a, type: r2, domainId: 5}\n  - {id: b, type: r2, domainId: 5}\n",
        "robots[1].domainId: domain ID 5 is also the domain of robots[0]",
    );
    assert_problem(
        "types:\n  - {type: s, backend: sim}\nrobots:\n  - {id: a, type: s, masterPort: 11311}\n",
        "robots[0].masterPort: only ros1 robots have a master port",
    );
    assert_problem(
        "types:\n  - {type: t, backend: ros1, defaultMode: x, modes: {run: {package: p, launchFile: run.launch}}}\n",
        "types[0].defaultMode: \"x\" is not one of the type's modes",
    );
    assert_problem(
        "types:\n  - {type: t, backend: ros1, modes: {run: {package: p, launchFile: ../../etc/x.launch}}}\n",
        "types[0].modes.run.launchFile: ",
    );
    assert_problem(
        "types:\n  - {type: t, backend: ros1, modes: {run: {package: p, launchFile: a.launch, env: {1BAD: x}}}}\n",
        "types[0].modes.run.env.1BAD: is not a valid environment variable name",
    );
    assert_problem(
        "types:\n  - {type: s, backend: sim, modes: {run: {package: other, launchFile: arm.launch}}}\n",
        "types[0].modes.run: sim robots launch rlark_sim/arm.launch",
    );
    assert_problem(
        "types:\n  - {type: t, backend: ros1}\n  - {type: t, backend: ros2}\n",
        "types[1].type: type \"t\" is defined twice",
    );
}

#[test]
fn every_preset_mode_is_resolved_per_robot() {
    // argFrom names a parameter the robot lacks.
    assert_problem(
        r#"
types:
  - type: franka
    backend: ros1
    modes: {run: {package: p, launchFile: run.launch, argFrom: {robot_ip: ip}}}
robots:
  - {id: arm, type: franka, params: {host: 10.0.0.2}}
"#,
        "robots[0]: mode \"run\" of type \"franka\": argFrom: launch argument \"robot_ip\" takes robot parameter \"ip\", which robot \"arm\" does not have",
    );
    // A sim argument that only goes wrong with this robot's parameter.
    assert_problem(
        &SIM.replace("params: {dof: 4}", "params: {dof: 40}"),
        "robots[0]: mode \"teleop\" of type \"sim-arm\": argument joints=\"40\" must be a whole number 1-32",
    );
}

#[test]
fn camera_rules() {
    let camera = |fields: &str| format!("cameras:\n  - {{{fields}}}\n");
    assert_problem(
        &camera("id: c, driver: sim, width: 0, height: 480, fps: 30, encoding: jpeg"),
        "cameras[0].width: must be 1-8192",
    );
    assert_problem(
        &camera("id: c, driver: rtsp, width: 640, height: 480, fps: 30, encoding: png"),
        "cameras[0].url: the rtsp driver needs a url",
    );
    assert_problem(
        &camera(
            "id: c, driver: sim, width: 640, height: 480, fps: 500, encoding: raw, url: rtsp://x",
        ),
        "cameras[0].fps: must be 1-240",
    );
    assert_problem(
        &camera(
            "id: c, driver: sim, width: 640, height: 480, fps: 30, encoding: raw, url: rtsp://x",
        ),
        "cameras[0].url: does not apply to the Sim driver",
    );
    let e = EmbodiedConfig::from_yaml(&camera(
        "id: c, driver: sim, width: 640, height: 480, fps: 30, encoding: gif",
    ))
    .expect_err("bad encoding");
    assert!(e.to_string().starts_with("cameras[0].encoding: "), "{e}");
}

#[test]
fn durations() {
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
    assert!(parse_duration("0s").is_err());
    assert!(parse_duration("2 weeks").is_err());
    let config = EmbodiedConfig::from_yaml("watchdog: 3\nstopTimeout: 100ms\n").expect("numbers");
    assert_eq!(config.watchdog, Duration::from_secs(3));
    assert_eq!(config.stop_timeout, Duration::from_millis(100));
}
