//! The Domain pod network in the agent (DESIGN §5–§8): per-replica network namespaces,
//! routing of their traffic between domain members, and its authorization.

pub mod datagram;
pub mod packet;
