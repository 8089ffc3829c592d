//! The reverse tunnel between agents and the hub (DESIGN §6, `docs/tunnel.md`).
//!
//! Agents dial out (`wss://SERVER/api/connect` with their client certificate); on that one
//! WebSocket runs a stream multiplexer with per-stream credit windows, so the hub can open
//! any number of independent streams to the agent — a TCP dial from the agent's host, the
//! agent's local API, later the pod-network relay — and one slow stream never stalls the
//! others.
//!
//! Layers, bottom up: [`transport`] (messages over WebSocket, framed by [`ws`], or in
//! memory for tests),
//! [`frame`] and [`mux`] (the multiplexer; frame codec is sans-IO), [`header`] (the
//! versioned request/response that starts every stream; sans-IO), [`relay`] (the body of a
//! pod-network relay stream; sans-IO), [`spdy`] (SPDY/3.1 framing for `kubectl
//! port-forward`; sans-IO), [`dial`] (hub side of
//! opening a stream), [`agent`] (agent side of serving streams), [`client`] (the agent's
//! reconnecting connection loop).
//!
//! It owns the tunnel only: it must not depend on another rlark crate (the agent's
//! local-API vocabulary is `rlark_api::agent::local`, the `/metrics` responder
//! `rlark_observe`).
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// Every public item says what it is: other crates and the agent build on this API.
#![deny(missing_docs)]

pub mod agent;
pub mod client;
pub mod dial;
pub mod frame;
pub mod header;
#[cfg(test)]
mod mutation;
pub mod mux;
mod pool;
pub mod relay;
pub mod spdy;
#[cfg(test)]
mod test_wait;
pub mod transport;
pub mod ws;
