//! The client-side contract of rlark's embodied runtime, everything a client needs and
//! nothing of the runtime itself:
//!
//! - the gRPC services `RobotController`, `CameraController` and `DeviceService`, with
//!   RLark's package, service, RPC and field names so its clients can switch
//!   (`docs/embodied.md`, `docs/compat.md`) ([`robot`], [`camera`], [`device`]), and the
//!   kubelet's device-plugin API (`v1beta1`) that the runtime's device plugin speaks
//!   ([`deviceplugin`]);
//! - [`sockets`]: the socket directory and socket names, the metadata keys and the
//!   environment variable of robot ownership;
//! - [`client`]: dialing a socket, and asking StartRobot for an owner;
//! - [`holders`]: the holders file, in which rlark's agent tells the runtime who holds
//!   which device.
//!
//! It depends on no other rlark crate: rlark's agent and CLI speak to the runtime through
//! it without linking the runtime (`rlark-embodied`).
//!
//! The `.proto` files live in `proto/rlark/embodied/v1/` and `proto/k8s/deviceplugin/v1beta1/`. The Rust code generated from them
//! (prost messages, tonic clients and servers) is checked in under `src/gen/`, so a build
//! needs neither `protoc` nor a build script. `tests/regenerate.rs` regenerates it with
//! protox and tonic-prost-build and fails on any difference; after editing a `.proto` file,
//! rewrite the checked-in code with
//!
//! ```text
//! RLARK_REGENERATE_PROTO=1 cargo test -p rlark-proto --test regenerate
//! ```
//!
//! Clients are generated without tonic's `connect(url)` helpers: build them on a
//! [`tonic::transport::Channel`] (e.g. one that dials a unix socket) with `Client::new`.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod client;
pub mod holders;
pub mod sockets;

/// `ros.controller.v1`: the RobotController service (ROS 1, ROS 2 and simulated robots).
pub mod robot {
    /// Version 1 of the RobotController contract.
    pub mod v1 {
        include!("gen/ros.controller.v1.rs");
    }
}

/// `camera.controller.v1`: the CameraController service.
pub mod camera {
    /// Version 1 of the CameraController contract.
    pub mod v1 {
        include!("gen/camera.controller.v1.rs");
    }
}

/// `device.v1`: the DeviceService (macvlan setup in the caller's network namespace).
pub mod device {
    /// Version 1 of the DeviceService contract.
    pub mod v1 {
        include!("gen/device.v1.rs");
    }
}

/// `v1beta1`: the kubelet device-plugin API (`Registration` on the kubelet's socket,
/// `DevicePlugin` served by a plugin), as upstream Kubernetes defines it.
pub mod deviceplugin {
    /// Version v1beta1 of the device-plugin API.
    pub mod v1beta1 {
        include!("gen/v1beta1.rs");
    }
}
