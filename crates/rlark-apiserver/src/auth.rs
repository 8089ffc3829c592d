//! Who is calling. The transport layer (mTLS in `rlark-server`) resolves credentials to an
//! [`Identity`] and inserts it as a request extension; requests without one get 401.

/// An authenticated caller, following Kubernetes conventions (certificate CN = user, O = groups).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

/// The group that grants every permission (like Kubernetes' `system:masters`).
pub const ADMIN_GROUP: &str = "system:masters";
