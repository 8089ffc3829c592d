//! The Kubernetes runtime's IO side: what talks to the member cluster.
//!
//! - [`nodes`]: the member's Nodes mirrored as rlark Nodes, and cordons pushed down;
//! - [`logs`]: `rlark logs` of a mirrored Pod from the member API.

pub mod logs;
pub mod nodes;
