//! `rlinf.io/v1alpha1`: rlark's resource types, their admission validation and CRD generation.
//!
//! No IO here: everything is a pure function of its input. The types build on `kube-core` and
//! `kube-derive` alone (the derive's `crates(kube_core = ::kube_core)`), not on the `kube`
//! facade, so depending on this crate brings in no Kubernetes client, hyper or tower.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// Every public item says what it is: this crate is the vocabulary the others share.
#![deny(missing_docs)]

pub mod agent;
pub mod crd;
pub mod defaults;
pub mod doc_text;
pub mod inert;
pub mod labels;
pub mod names;
pub mod quantity;
pub mod types;
pub mod validation;

/// API group of every rlark resource.
pub const GROUP: &str = "rlinf.io";
/// The one served version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` field value.
pub const API_VERSION: &str = "rlinf.io/v1alpha1";
