//! V4L2 (USB) camera discovery from sysfs (`/sys/class/video4linux`).
//!
//! A UVC camera registers several device nodes: the video capture node has `index` 0, the
//! others (metadata) higher indexes, so nodes whose `index` is not 0 are left out. The name
//! comes from the node's `name`; the serial number from the USB device's `serial`
//! (the parent of the interface the node's `device` link points to). Capture itself goes
//! through ffmpeg (`super::ffmpeg`), so no ioctl is issued here.

use std::path::{Path, PathBuf};

/// Where the kernel lists video devices.
pub const SYSFS_ROOT: &str = "/sys/class/video4linux";

/// A V4L2 capture device found in sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V4l2Device {
    /// The sysfs node name, e.g. `video0` (also the camera ID of an unconfigured device).
    pub node: String,
    /// The device file, `/dev/<node>`.
    pub device: PathBuf,
    /// What the driver calls the device (`name`), e.g. `HD Pro Webcam C920`.
    pub name: String,
    /// USB serial number, empty when the device has none.
    pub serial: String,
}

/// The capture devices listed under `root` (normally [`SYSFS_ROOT`]), in node-number order.
/// A missing or unreadable `root` lists nothing.
pub fn scan(root: &Path) -> Vec<V4l2Device> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, V4l2Device)> = Vec::new();
    for entry in entries.flatten() {
        let node = entry.file_name().to_string_lossy().into_owned();
        let Some(number) = node
            .strip_prefix("video")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = root.join(&node);
        // Metadata nodes of the same camera have index 1, 2, ...
        if read_attr(&dir.join("index")).is_some_and(|index| index != "0") {
            continue;
        }
        let name = read_attr(&dir.join("name")).unwrap_or_else(|| node.clone());
        let serial = std::fs::canonicalize(dir.join("device"))
            .ok()
            .and_then(|interface| {
                interface
                    .parent()
                    .and_then(|usb| read_attr(&usb.join("serial")))
            })
            .unwrap_or_default();
        found.push((
            number,
            V4l2Device {
                device: Path::new("/dev").join(&node),
                node,
                name,
                serial,
            },
        ));
    }
    found.sort_by_key(|(number, _)| *number);
    found.into_iter().map(|(_, device)| device).collect()
}

/// A sysfs attribute, trimmed; `None` when absent or empty.
fn read_attr(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_capture_nodes_with_name_and_serial() {
        let root = tempfile::tempdir().expect("tempdir");
        let usb = root.path().join("devices/usb1/1-1");
        let interface = usb.join("1-1:1.0");
        std::fs::create_dir_all(&interface).expect("mkdir");
        std::fs::write(usb.join("serial"), "ABC123\n").expect("serial");
        let class = root.path().join("class");
        for (node, index, name) in [
            ("video0", "0", "HD Webcam\n"),
            ("video1", "1", "HD Webcam\n"),
            ("video10", "0", "Other cam\n"),
            ("video2", "0", "Second\n"),
        ] {
            let dir = class.join(node);
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("index"), index).expect("index");
            std::fs::write(dir.join("name"), name).expect("name");
        }
        std::os::unix::fs::symlink(&interface, class.join("video0/device")).expect("link");
        std::fs::create_dir_all(class.join("not-a-video")).expect("mkdir");

        let found = scan(&class);
        let nodes: Vec<&str> = found.iter().map(|d| d.node.as_str()).collect();
        assert_eq!(nodes, ["video0", "video2", "video10"]);
        assert_eq!(found[0].name, "HD Webcam");
        assert_eq!(found[0].serial, "ABC123");
        assert_eq!(found[0].device, PathBuf::from("/dev/video0"));
        assert_eq!(found[1].serial, "");
        assert!(scan(&root.path().join("missing")).is_empty());
    }
}
