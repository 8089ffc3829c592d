//! The pod network's data path in the agent (issue 16; DESIGN §5–§8).

pub mod direct;
pub mod inbound;
pub mod membership;
pub mod metrics;
pub mod router;
