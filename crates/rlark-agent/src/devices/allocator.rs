//! Pure: which robots and cameras a replica gets (docs/embodied.md, "Devices on rlark's
//! own agents").
//!
//! A replica whose task requests `rlinf.io/...` resources gets specific devices when it
//! starts: for each model resource (`rlinf.io/robot-sim-arm: 2`) that many healthy devices
//! of that model no other replica holds, then for `rlinf.io/device: n` enough more of any
//! model to make n in all. They are the replica's until it ends (restarts keep them); one
//! that does not fit fails the start with [`REASON_DEVICES_UNAVAILABLE`], as a kubelet
//! fails a pod its device plugins cannot serve.

use std::collections::BTreeMap;
use std::path::Path;

use rlark_api::quantity::parse_quantity;
use rlark_api::types::{NodeDevice, ResourceList};
use rlark_proto::sockets::{CAMERA_SOCKET, OWNER_ENV, ROS_SOCKET, ROS2_SOCKET};

use super::inventory::{DEVICE_RESOURCE, HEALTHY, is_device_key};

/// Pod reason when a replica's devices cannot be given to it.
pub const REASON_DEVICES_UNAVAILABLE: &str = "DevicesUnavailable";

/// A device as the runtime offers it: its Node entry and what a replica needs to use it.
#[derive(Clone, Debug, PartialEq)]
pub struct Offered {
    pub device: NodeDevice,
    /// The socket (file name in the socket directory) that serves it.
    pub socket: &'static str,
    /// A ROS 1 robot's master.
    pub ros_master_uri: Option<String>,
    /// A ROS 2 robot's domain.
    pub ros_domain_id: Option<i32>,
}

/// The devices on offer and who holds which.
#[derive(Debug, Default)]
pub struct Allocator {
    offered: Vec<Offered>,
    /// Device ID → holder (a replica's key).
    held: BTreeMap<String, String>,
}

/// The device requests in `requests` (a task's per-replica requests): resource → count.
/// A device is whole: a count that is not a whole number is an error naming it.
pub fn device_requests(requests: &ResourceList) -> Result<BTreeMap<String, u64>, String> {
    let mut wants = BTreeMap::new();
    for (name, quantity) in requests.iter().filter(|(k, _)| is_device_key(k)) {
        // Whole: the milli-value is a multiple of 1000.
        let count = parse_quantity(&quantity.0)
            .ok()
            .and_then(|v| v.milli_value())
            .filter(|m| *m >= 0 && m % 1000 == 0)
            .and_then(|m| u64::try_from(m / 1000).ok())
            .ok_or_else(|| {
                format!(
                    "request {name}={:?} is not a whole number of devices",
                    quantity.0
                )
            })?;
        if count > 0 {
            wants.insert(name.clone(), count);
        }
    }
    Ok(wants)
}

/// The device requests of several lists (a docker task's containers), summed per
/// resource; errors as [`device_requests`].
pub fn device_requests_of(lists: &[&ResourceList]) -> Result<BTreeMap<String, u64>, String> {
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    for list in lists {
        for (name, count) in device_requests(list)? {
            *total.entry(name).or_default() += count;
        }
    }
    Ok(total)
}

impl Allocator {
    /// What the runtime offers now (the last poll).
    pub fn set_offered(&mut self, offered: Vec<Offered>) {
        self.offered = offered;
    }

    /// The devices `holder` holds, by ID.
    pub fn held_by(&self, holder: &str) -> Vec<Offered> {
        let mut held: Vec<Offered> = self
            .offered
            .iter()
            .filter(|o| self.held.get(&o.device.id).is_some_and(|h| h == holder))
            .cloned()
            .collect();
        held.sort_by(|a, b| a.device.id.cmp(&b.device.id));
        held
    }

    /// Gives `holder` devices for `wants` (module docs), preferring the IDs in `prefer`
    /// (what an earlier agent recorded for it). A holder that already holds devices keeps
    /// them. Nothing is taken when they do not all fit; the error names what is missing.
    pub fn allocate(
        &mut self,
        holder: &str,
        wants: &BTreeMap<String, u64>,
        prefer: &[String],
    ) -> Result<Vec<Offered>, String> {
        let already = self.held_by(holder);
        if !already.is_empty() || wants.is_empty() {
            return Ok(already);
        }
        let free =
            |o: &&Offered| o.device.health == HEALTHY && !self.held.contains_key(&o.device.id);
        let mut candidates: Vec<&Offered> = self.offered.iter().filter(free).collect();
        // Preferred first, then by ID: deterministic.
        candidates.sort_by_key(|o| (!prefer.contains(&o.device.id), o.device.id.clone()));
        let mut chosen: Vec<&Offered> = Vec::new();
        let mut missing = Vec::new();
        for (resource, count) in wants.iter().filter(|(r, _)| r.as_str() != DEVICE_RESOURCE) {
            let mut of_model = candidates
                .iter()
                .filter(|o| o.device.resource == *resource && !chosen.contains(o))
                .copied()
                .collect::<Vec<_>>();
            let have = of_model.len() as u64;
            if have < *count {
                missing.push(format!(
                    "{resource}: {count} wanted, {have} free and healthy"
                ));
            }
            of_model.truncate(usize::try_from(*count).unwrap_or(usize::MAX));
            chosen.extend(of_model);
        }
        if let Some(total) = wants.get(DEVICE_RESOURCE) {
            let more = total.saturating_sub(chosen.len() as u64);
            let rest: Vec<&Offered> = candidates
                .iter()
                .filter(|o| !chosen.contains(o))
                .take(usize::try_from(more).unwrap_or(usize::MAX))
                .copied()
                .collect();
            if (rest.len() as u64) < more {
                missing.push(format!(
                    "{DEVICE_RESOURCE}: {total} wanted, {} free and healthy",
                    chosen.len() + rest.len()
                ));
            }
            chosen.extend(rest);
        }
        if !missing.is_empty() {
            return Err(format!(
                "devices not available on this node: {}",
                missing.join("; ")
            ));
        }
        for o in &chosen {
            self.held.insert(o.device.id.clone(), holder.to_string());
        }
        Ok(self.held_by(holder))
    }

    /// Every holder with the devices it holds that are unhealthy now (holders whose
    /// devices are all healthy are listed with none).
    pub fn problems(&self) -> BTreeMap<String, Vec<NodeDevice>> {
        let mut out: BTreeMap<String, Vec<NodeDevice>> = BTreeMap::new();
        for (id, holder) in &self.held {
            let list = out.entry(holder.clone()).or_default();
            if let Some(o) = self.offered.iter().find(|o| o.device.id == *id)
                && o.device.health != HEALTHY
            {
                list.push(o.device.clone());
            }
        }
        out
    }

    /// `holder`'s devices are free again.
    pub fn release(&mut self, holder: &str) {
        self.held.retain(|_, h| h != holder);
    }
}

/// The environment a replica holding `devices` gets, the contract the Python SDK reads
/// (the device plugin's `Allocate` gives a kubelet's containers the same): the IDs, the
/// socket of each kind it holds, for exactly one robot its ROS master / domain, and
/// `RLINF_EMBODIED_OWNER` = `owner` (`<namespace>/<pod>`), which the SDKs send as
/// `rlark-owner` so the replica, not the calling process, owns the robots it starts.
pub fn replica_env(socket_dir: &Path, devices: &[Offered], owner: &str) -> Vec<(String, String)> {
    if devices.is_empty() {
        return Vec::new();
    }
    let socket = |name: &str| socket_dir.join(name).display().to_string();
    let ids: Vec<&str> = devices.iter().map(|o| o.device.id.as_str()).collect();
    let mut env = vec![
        (
            "RLINF_EMBODIED_RUNTIME_ENABLED".to_string(),
            "1".to_string(),
        ),
        ("RLINF_EMBODIED_DEVICES".to_string(), ids.join(",")),
        (OWNER_ENV.to_string(), owner.to_string()),
    ];
    let uses = |name: &str| devices.iter().any(|o| o.socket == name);
    for (name, flag, path) in [
        (
            ROS_SOCKET,
            "RLINF_EMBODIED_ROS_ENABLED",
            "RLINF_EMBODIED_ROS_SOCKET_PATH",
        ),
        (
            ROS2_SOCKET,
            "RLINF_EMBODIED_ROS2_ENABLED",
            "RLINF_EMBODIED_ROS2_SOCKET_PATH",
        ),
        (
            CAMERA_SOCKET,
            "RLINF_EMBODIED_CAMERA_ENABLED",
            "RLINF_EMBODIED_CAMERA_SOCKET_PATH",
        ),
    ] {
        if uses(name) {
            env.push((flag.to_string(), "1".to_string()));
            env.push((path.to_string(), socket(name)));
        }
    }
    let robots: Vec<&Offered> = devices
        .iter()
        .filter(|o| o.device.id.starts_with("robot-"))
        .collect();
    if let [robot] = robots[..] {
        if let Some(uri) = robot.ros_master_uri.clone().filter(|u| !u.is_empty()) {
            env.push(("ROS_MASTER_URI".to_string(), uri));
        }
        if let Some(domain) = robot.ros_domain_id {
            env.push(("ROS_DOMAIN_ID".to_string(), domain.to_string()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn offered(id: &str, resource: &str, healthy: bool, socket: &'static str) -> Offered {
        Offered {
            device: NodeDevice {
                id: id.into(),
                resource: resource.into(),
                health: if healthy { HEALTHY } else { "Unhealthy" }.into(),
                message: None,
            },
            socket,
            ros_master_uri: None,
            ros_domain_id: None,
        }
    }

    fn wants(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| ((*k).to_string(), *v)).collect()
    }

    fn ids(list: &[Offered]) -> Vec<&str> {
        list.iter().map(|o| o.device.id.as_str()).collect()
    }

    const ARM: &str = "rlinf.io/robot-sim-arm";
    const CAM: &str = "rlinf.io/camera-sim";

    fn lab() -> Allocator {
        let mut a = Allocator::default();
        a.set_offered(vec![
            offered("robot-a", ARM, true, ROS_SOCKET),
            offered("robot-b", ARM, false, ROS_SOCKET),
            offered("camera-c", CAM, true, CAMERA_SOCKET),
        ]);
        a
    }

    #[test]
    fn devices_are_exclusive_healthy_and_freed_when_released() {
        let mut a = lab();
        let first = a
            .allocate("r1", &wants(&[(ARM, 1), (CAM, 1)]), &[])
            .expect("fits");
        assert_eq!(ids(&first), ["camera-c", "robot-a"], "by ID");
        let again = a.allocate("r1", &wants(&[(ARM, 1)]), &[]).expect("kept");
        assert_eq!(
            ids(&again),
            ["camera-c", "robot-a"],
            "a holder keeps what it has"
        );
        let err = a
            .allocate("r2", &wants(&[(ARM, 1)]), &[])
            .expect_err("taken");
        assert!(
            err.contains("rlinf.io/robot-sim-arm: 1 wanted, 0 free and healthy"),
            "{err}"
        );
        assert!(a.held_by("r2").is_empty(), "nothing taken on failure");
        let mut failing = lab();
        failing
            .allocate("r1", &wants(&[(ARM, 1)]), &[])
            .expect("fits");
        failing.set_offered(vec![offered("robot-a", ARM, false, ROS_SOCKET)]);
        let problems = failing.problems();
        assert_eq!(
            problems["r1"]
                .iter()
                .map(|d| d.id.as_str())
                .collect::<Vec<_>>(),
            ["robot-a"],
            "a held device that failed is the holder's problem"
        );
        a.release("r1");
        assert_eq!(
            ids(&a.allocate("r2", &wants(&[(ARM, 1)]), &[]).expect("free")),
            ["robot-a"]
        );
    }

    #[test]
    fn any_device_counts_after_the_models_and_preferred_ids_come_first() {
        let mut a = lab();
        let got = a
            .allocate("r", &wants(&[(DEVICE_RESOURCE, 2), (CAM, 1)]), &[])
            .expect("fits");
        assert_eq!(ids(&got), ["camera-c", "robot-a"]);
        let mut b = Allocator::default();
        b.set_offered(vec![
            offered("robot-a", ARM, true, ROS_SOCKET),
            offered("robot-z", ARM, true, ROS_SOCKET),
        ]);
        let got = b
            .allocate("r", &wants(&[(ARM, 1)]), &["robot-z".to_string()])
            .expect("fits");
        assert_eq!(ids(&got), ["robot-z"], "what was recorded before wins");
    }

    #[test]
    fn requests_must_be_whole_devices() {
        let list = |v: &str| -> ResourceList {
            BTreeMap::from([
                (ARM.to_string(), Quantity(v.to_string())),
                ("cpu".to_string(), Quantity("500m".into())),
            ])
        };
        assert_eq!(device_requests(&list("2")).expect("ok"), wants(&[(ARM, 2)]));
        assert!(device_requests(&list("0")).expect("ok").is_empty());
        let err = device_requests(&list("500m")).expect_err("a half arm");
        assert!(err.contains("rlinf.io/robot-sim-arm"), "{err}");
        let (one, two) = (list("1"), list("2"));
        assert_eq!(
            device_requests_of(&[&one, &two]).expect("ok"),
            wants(&[(ARM, 3)]),
            "containers' requests add up"
        );
        assert!(device_requests_of(&[&one, &list("0.5")]).is_err());
    }

    #[test]
    fn env_names_the_devices_and_their_sockets() {
        let mut arm = offered("robot-a", ARM, true, ROS_SOCKET);
        arm.ros_master_uri = Some("http://127.0.0.1:11311".into());
        let cam = offered("camera-c", CAM, true, CAMERA_SOCKET);
        let env: BTreeMap<String, String> = replica_env(Path::new("/run/e"), &[arm, cam], "ns/p-0")
            .into_iter()
            .collect();
        assert_eq!(env["RLINF_EMBODIED_DEVICES"], "robot-a,camera-c");
        assert_eq!(env["RLINF_EMBODIED_OWNER"], "ns/p-0");
        assert_eq!(
            env["RLINF_EMBODIED_ROS_SOCKET_PATH"],
            "/run/e/ros-ctrl.sock"
        );
        assert_eq!(
            env["RLINF_EMBODIED_CAMERA_SOCKET_PATH"],
            "/run/e/camera-ctrl.sock"
        );
        assert_eq!(env["ROS_MASTER_URI"], "http://127.0.0.1:11311");
        assert!(!env.contains_key("RLINF_EMBODIED_ROS2_SOCKET_PATH"));
        assert!(replica_env(Path::new("/run/e"), &[], "ns/p-0").is_empty());
    }
}
