//! Launch packages a controller knows: what ListPackages, GetPackageInfo,
//! GetPackageLaunchFiles and GetLaunchFileArgs answer.
//!
//! - ROS 1 (`ros-ctrl.sock` with ros1 robots): packages found under the directories of
//!   `ros.packagePath` (default `ROS_PACKAGE_PATH`), as a directory holding `package.xml`
//!   (searched at most 6 levels deep; packages do not nest); launch files under its
//!   `launch/` directory.
//! - ROS 2 (`ros2-ctrl.sock`): `PREFIX/share/PACKAGE/package.xml` for each prefix of
//!   `ros2.prefixPath` (default `AMENT_PREFIX_PATH`); launch files under
//!   `PREFIX/share/PACKAGE/launch/`.
//! - Simulated robots (`ros-ctrl.sock` with sim robots): the built-in `rlark_sim`.
//!
//! The first package of a name wins, as on a ROS package path. The file system is read on
//! each call, so packages installed while the controller runs show up. Launch arguments are
//! read from XML launch files (`<arg name default|value doc|description>`: an arg with a
//! `value` is a constant and not listed; one with neither is required), YAML launch files
//! (`launch: [{arg: {name, default, description}}]`) and, best effort, Python launch files
//! (`DeclareLaunchArgument('name', default_value='...', description='...')` with literal
//! strings).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;
use rlark_proto::robot::v1::{LaunchArg, PackageInfo};

use super::error::RobotError;
use super::sim_launch;
use crate::config::{Backend, EmbodiedConfig};

/// Deepest directory level searched below a ROS 1 package path entry.
const MAX_DEPTH: usize = 6;
/// Most directories visited per package path entry (bounds a search of a huge tree).
const MAX_DIRS: usize = 20_000;
/// Launch directories are listed this deep.
const MAX_LAUNCH_DEPTH: usize = 4;
/// Launch files larger than this are not parsed for arguments.
const MAX_LAUNCH_FILE: u64 = 4 << 20;

/// ROS package names (and what custom launches may name): letters, digits, `_`, `-`.
pub fn valid_package_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A non-empty relative path with only normal components (no `..`, no root).
pub fn is_relative_clean(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Where a package was found.
#[derive(Clone, Debug, PartialEq)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub description: String,
    pub maintainer: String,
    /// Directory of its launch files; `None` for the built-in simulator package.
    pub launch_dir: Option<PathBuf>,
}

/// The package sources of one controller socket.
#[derive(Clone, Debug)]
pub struct Catalog {
    builtin_sim: bool,
    ros1_roots: Vec<PathBuf>,
    ros2_prefixes: Vec<PathBuf>,
    allowed: Vec<String>,
}

fn path_list(
    configured: &Option<Vec<PathBuf>>,
    var: &str,
    config: &EmbodiedConfig,
) -> Vec<PathBuf> {
    if let Some(paths) = configured {
        return paths.clone();
    }
    let value = config
        .env
        .get(var)
        .cloned()
        .or_else(|| std::env::var(var).ok())
        .unwrap_or_default();
    std::env::split_paths(&value)
        .filter(|p| !p.as_os_str().is_empty())
        .collect()
}

impl Catalog {
    /// The catalog of the socket serving robots with these backends.
    pub fn new(config: &EmbodiedConfig, backends: &[Backend]) -> Self {
        let ros1 = backends.contains(&Backend::Ros1);
        let ros2 = backends.contains(&Backend::Ros2);
        Self {
            builtin_sim: backends.contains(&Backend::Sim),
            ros1_roots: if ros1 {
                path_list(&config.ros.package_path, "ROS_PACKAGE_PATH", config)
            } else {
                Vec::new()
            },
            ros2_prefixes: if ros2 {
                path_list(&config.ros2.prefix_path, "AMENT_PREFIX_PATH", config)
            } else {
                Vec::new()
            },
            allowed: config.allowed_launch_packages.clone(),
        }
    }

    fn allowed(&self, name: &str) -> bool {
        self.allowed.iter().any(|p| p == "*" || p == name)
    }

    /// Every package, by name.
    pub fn packages(&self) -> BTreeMap<String, Package> {
        let mut found = BTreeMap::new();
        if self.builtin_sim {
            found.insert(sim_launch::PACKAGE.to_string(), sim_package());
        }
        for root in &self.ros1_roots {
            for package in ros1_packages(root) {
                found.entry(package.name.clone()).or_insert(package);
            }
        }
        for prefix in &self.ros2_prefixes {
            for package in ros2_packages(prefix) {
                found.entry(package.name.clone()).or_insert(package);
            }
        }
        found
    }

    pub fn info(&self, package: &Package) -> PackageInfo {
        PackageInfo {
            name: package.name.clone(),
            version: package.version.clone(),
            description: package.description.clone(),
            maintainer: package.maintainer.clone(),
            allowed: self.allowed(&package.name),
        }
    }

    /// The package called `name`.
    pub fn package(&self, name: &str) -> Result<Package, RobotError> {
        if !valid_package_name(name) {
            return Err(RobotError::InvalidArgument(format!(
                "{name:?} is not a package name"
            )));
        }
        self.packages()
            .remove(name)
            .ok_or_else(|| RobotError::NotFound(format!("package {name:?} not found")))
    }

    /// The launch files of a package, relative to its launch directory, sorted.
    pub fn launch_files(&self, name: &str) -> Result<Vec<String>, RobotError> {
        let package = self.package(name)?;
        Ok(match &package.launch_dir {
            None => vec![sim_launch::LAUNCH_FILE.to_string()],
            Some(dir) => list_launch_files(dir),
        })
    }

    /// The arguments a launch file declares.
    pub fn launch_args(&self, name: &str, launch_file: &str) -> Result<Vec<LaunchArg>, RobotError> {
        if !is_relative_clean(launch_file) {
            return Err(RobotError::InvalidArgument(format!(
                "launch file {launch_file:?} must be a relative path inside the package"
            )));
        }
        let package = self.package(name)?;
        let Some(dir) = &package.launch_dir else {
            return if launch_file == sim_launch::LAUNCH_FILE {
                Ok(sim_launch::launch_args())
            } else {
                Err(RobotError::NotFound(format!(
                    "package {name:?} has no launch file {launch_file:?}"
                )))
            };
        };
        let path = dir.join(launch_file);
        let too_big = std::fs::metadata(&path).map(|m| !m.is_file() || m.len() > MAX_LAUNCH_FILE);
        match too_big {
            Err(_) => Err(RobotError::NotFound(format!(
                "package {name:?} has no launch file {launch_file:?}"
            ))),
            Ok(true) => Err(RobotError::InvalidArgument(format!(
                "{launch_file:?} is not a launch file of at most {MAX_LAUNCH_FILE} bytes"
            ))),
            Ok(false) => {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    RobotError::InvalidArgument(format!("read launch file {launch_file:?}: {e}"))
                })?;
                parse_launch_args(launch_file, &text).map_err(|e| {
                    RobotError::InvalidArgument(format!("launch file {launch_file:?}: {e}"))
                })
            }
        }
    }
}

fn sim_package() -> Package {
    Package {
        name: sim_launch::PACKAGE.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        description: "rlark's built-in simulated arm".to_string(),
        maintainer: "rlark".to_string(),
        launch_dir: None,
    }
}

/// Packages below a ROS 1 package path entry (breadth first, bounded).
fn ros1_packages(root: &Path) -> Vec<Package> {
    let mut found = Vec::new();
    let mut queue = VecDeque::from([(root.to_path_buf(), 0usize)]);
    let mut visited = 0;
    while let Some((dir, depth)) = queue.pop_front() {
        visited += 1;
        if visited > MAX_DIRS {
            tracing::warn!(root = %root.display(), "package search stopped after {MAX_DIRS} directories");
            break;
        }
        let manifest = dir.join("package.xml");
        if manifest.is_file() {
            if let Some(package) = read_manifest(&manifest, dir.join("launch")) {
                found.push(package);
            }
            continue;
        }
        if depth >= MAX_DEPTH {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut children: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| e.path())
            .collect();
        children.sort();
        queue.extend(children.into_iter().map(|c| (c, depth + 1)));
    }
    found
}

/// Packages of a ROS 2 install prefix.
fn ros2_packages(prefix: &Path) -> Vec<Package> {
    let Ok(entries) = std::fs::read_dir(prefix.join("share")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    dirs.sort();
    dirs.into_iter()
        .filter_map(|dir| {
            let manifest = dir.join("package.xml");
            manifest
                .is_file()
                .then(|| read_manifest(&manifest, dir.join("launch")))
                .flatten()
        })
        .collect()
}

/// Read a `package.xml`; `None` (logged) when it is unreadable or has no valid name.
fn read_manifest(path: &Path, launch_dir: PathBuf) -> Option<Package> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "unreadable package.xml");
            return None;
        }
    };
    match parse_manifest(&text) {
        Ok(mut package) => {
            package.launch_dir = Some(launch_dir);
            Some(package)
        }
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "skipping package.xml");
            None
        }
    }
}

/// The name, version, description and maintainers of a `package.xml`.
pub fn parse_manifest(text: &str) -> Result<Package, String> {
    let doc = roxmltree::Document::parse(text).map_err(|e| e.to_string())?;
    let root = doc.root_element();
    if root.tag_name().name() != "package" {
        return Err(format!(
            "root element is <{}>, not <package>",
            root.tag_name().name()
        ));
    }
    let text_of = |tag: &str| -> Vec<String> {
        root.children()
            .filter(|n| n.is_element() && n.tag_name().name() == tag)
            .map(|n| collapse(&element_text(n)))
            .collect()
    };
    let name = text_of("name").into_iter().next().unwrap_or_default();
    if !valid_package_name(&name) {
        return Err(format!("invalid package name {name:?}"));
    }
    let maintainers: Vec<String> = root
        .children()
        .filter(|n| n.is_element() && n.tag_name().name() == "maintainer")
        .map(|n| {
            let who = collapse(&element_text(n));
            match n.attribute("email") {
                Some(email) => format!("{who} <{email}>"),
                None => who,
            }
        })
        .collect();
    Ok(Package {
        name,
        version: text_of("version").into_iter().next().unwrap_or_default(),
        description: text_of("description")
            .into_iter()
            .next()
            .unwrap_or_default(),
        maintainer: maintainers.join(", "),
        launch_dir: None,
    })
}

fn element_text(node: roxmltree::Node<'_, '_>) -> String {
    node.descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect()
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn is_launch_file(name: &str) -> bool {
    [
        ".launch",
        ".launch.xml",
        ".launch.py",
        ".launch.yaml",
        ".launch.yml",
    ]
    .iter()
    .any(|suffix| name.ends_with(suffix))
}

/// Launch files below `dir`, relative to it, sorted.
fn list_launch_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((current, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && depth + 1 < MAX_LAUNCH_DEPTH {
                stack.push((path, depth + 1));
            } else if kind.is_file()
                && is_launch_file(&entry.file_name().to_string_lossy())
                && let Ok(relative) = path.strip_prefix(dir)
            {
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    found
}

/// The arguments declared by a launch file, by its kind (file name).
pub fn parse_launch_args(file_name: &str, text: &str) -> Result<Vec<LaunchArg>, String> {
    if file_name.ends_with(".py") {
        Ok(python_launch_args(text))
    } else if file_name.ends_with(".yaml") || file_name.ends_with(".yml") {
        yaml_launch_args(text)
    } else {
        xml_launch_args(text)
    }
}

fn xml_launch_args(text: &str) -> Result<Vec<LaunchArg>, String> {
    let doc = roxmltree::Document::parse(text).map_err(|e| e.to_string())?;
    let root = doc.root_element();
    Ok(root
        .children()
        .filter(|n| n.is_element() && n.tag_name().name() == "arg")
        // An arg with a value is a constant of the file, not something to pass.
        .filter(|n| n.attribute("value").is_none())
        .filter_map(|n| {
            let name = n.attribute("name")?.to_string();
            let default = n.attribute("default");
            Some(LaunchArg {
                name,
                required: default.is_none(),
                default: default.unwrap_or_default().to_string(),
                description: n
                    .attribute("doc")
                    .or_else(|| n.attribute("description"))
                    .unwrap_or_default()
                    .to_string(),
            })
        })
        .collect())
}

fn yaml_launch_args(text: &str) -> Result<Vec<LaunchArg>, String> {
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    let items = value["launch"].as_array().cloned().unwrap_or_default();
    let scalar = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        other => Some(other.to_string()),
    };
    Ok(items
        .iter()
        .filter_map(|item| {
            let arg = item.get("arg")?;
            let name = arg.get("name").and_then(scalar)?;
            let default = arg.get("default").and_then(scalar);
            Some(LaunchArg {
                name,
                required: default.is_none(),
                default: default.unwrap_or_default(),
                description: arg.get("description").and_then(scalar).unwrap_or_default(),
            })
        })
        .collect())
}

// The two patterns are constants, checked by this module's tests: compiling them cannot fail.
#[allow(clippy::expect_used)]
static DECLARE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"DeclareLaunchArgument\s*\(").expect("valid regex"));
#[allow(clippy::expect_used)]
static FIRST_STRING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^\s*(?:name\s*=\s*)?(?:'([^']*)'|"([^"]*)")"#).expect("valid regex")
});

fn keyword_string(call: &str, keyword: &str) -> Option<String> {
    let pattern = format!(r#"\b{keyword}\s*=\s*(?:'([^']*)'|"([^"]*)")"#);
    let re = Regex::new(&pattern).ok()?;
    let captures = re.captures(call)?;
    captures
        .get(1)
        .or_else(|| captures.get(2))
        .map(|m| m.as_str().to_string())
}

/// `DeclareLaunchArgument(...)` calls with a literal name (best effort, no Python parser).
fn python_launch_args(text: &str) -> Vec<LaunchArg> {
    let mut args = Vec::new();
    for found in DECLARE.find_iter(text) {
        // The call's text up to its matching parenthesis.
        let rest = &text[found.end()..];
        let mut depth = 1usize;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let call = &rest[..end];
        let Some(name) = FIRST_STRING
            .captures(call)
            .and_then(|c| c.get(1).or_else(|| c.get(2)))
            .map(|m| m.as_str().to_string())
            .or_else(|| keyword_string(call, "name"))
        else {
            continue;
        };
        let default = keyword_string(call, "default_value");
        // A default that is not a literal string is still a default.
        let has_default = default.is_some() || call.contains("default_value");
        args.push(LaunchArg {
            name,
            required: !has_default,
            default: default.unwrap_or_default(),
            description: keyword_string(call, "description").unwrap_or_default(),
        });
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_names() {
        assert!(is_relative_clean("a.launch"));
        assert!(is_relative_clean("sub/a.launch"));
        for bad in ["", "/etc/passwd", "../x.launch", "a/../../b", "./a"] {
            assert!(!is_relative_clean(bad), "{bad}");
        }
        assert!(valid_package_name("franka_control"));
        assert!(!valid_package_name("a/b"));
        assert!(!valid_package_name(""));
    }

    #[test]
    fn reads_package_manifests() {
        let package = parse_manifest(
            r#"<?xml version="1.0"?>
            <package format="2">
              <name>arm_bringup</name>
              <version>1.2.3</version>
              <description>
                Brings up   the arm.
              </description>
              <maintainer email="ops@example.org">Ops Team</maintainer>
              <maintainer>Second</maintainer>
            </package>"#,
        )
        .expect("parse");
        assert_eq!(package.name, "arm_bringup");
        assert_eq!(package.version, "1.2.3");
        assert_eq!(package.description, "Brings up the arm.");
        assert_eq!(package.maintainer, "Ops Team <ops@example.org>, Second");
        assert!(parse_manifest("<package><name>bad name</name></package>").is_err());
        assert!(parse_manifest("<other/>").is_err());
    }

    fn summary(args: &[LaunchArg]) -> Vec<(String, bool, String, String)> {
        args.iter()
            .map(|a| {
                (
                    a.name.clone(),
                    a.required,
                    a.default.clone(),
                    a.description.clone(),
                )
            })
            .collect()
    }

    fn expect(rows: &[(&str, bool, &str, &str)]) -> Vec<(String, bool, String, String)> {
        rows.iter()
            .map(|(n, r, d, s)| (n.to_string(), *r, d.to_string(), s.to_string()))
            .collect()
    }

    #[test]
    fn reads_launch_arguments_of_each_kind() {
        let xml = r#"<launch>
            <arg name="robot_ip" doc="address of the arm"/>
            <arg name="rate" default="100"/>
            <arg name="constant" value="1"/>
            <group><arg name="nested" default="x"/></group>
        </launch>"#;
        let args = parse_launch_args("bringup.launch", xml).expect("xml");
        assert_eq!(
            summary(&args),
            expect(&[
                ("robot_ip", true, "", "address of the arm"),
                ("rate", false, "100", "")
            ])
        );

        let yaml = "launch:\n- arg: {name: use_sim, default: 'false', description: sim or not}\n- arg: {name: ip}\n- node: {pkg: x}\n";
        let args = parse_launch_args("x.launch.yaml", yaml).expect("yaml");
        assert_eq!(
            summary(&args),
            expect(&[
                ("use_sim", false, "false", "sim or not"),
                ("ip", true, "", "")
            ])
        );

        let py = r#"
def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument('robot_ip', description="arm (IPv4)"),
        DeclareLaunchArgument(
            name="rate", default_value='100',
        ),
        DeclareLaunchArgument('mode', default_value=some_function('x')),
    ])
"#;
        let args = parse_launch_args("arm.launch.py", py).expect("py");
        assert_eq!(
            summary(&args),
            expect(&[
                ("robot_ip", true, "", "arm (IPv4)"),
                ("rate", false, "100", ""),
                ("mode", false, "", ""),
            ])
        );
        assert!(parse_launch_args("broken.launch", "<launch>").is_err());
    }
}
